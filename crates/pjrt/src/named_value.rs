//! Plugin-specific options (`PJRT_NamedValue`), e.g. `cpu_device_count` for the CPU client.

use crate::ffi;

/// The value of a named option passed to a client or topology.
#[derive(Debug, Clone, PartialEq)]
pub enum NamedValue {
    /// A 64-bit integer, e.g. `cpu_device_count`.
    Int64(i64),
    /// A string.
    Str(String),
    /// A 32-bit float.
    Float(f32),
    /// A boolean.
    Bool(bool),
    /// A list of 64-bit integers.
    Int64List(Vec<i64>),
}

/// `PJRT_NamedValue`s pointing into the caller's options; valid while those are borrowed.
pub(crate) struct RawNamedValues<'a> {
    values: Vec<ffi::PJRT_NamedValue>,
    _borrowed: std::marker::PhantomData<&'a [(&'a str, NamedValue)]>,
}

impl<'a> RawNamedValues<'a> {
    pub(crate) fn new(options: &'a [(&'a str, NamedValue)]) -> Self {
        let values = options
            .iter()
            .map(|(name, value)| {
                let mut raw = new_args!(PJRT_NamedValue);
                raw.name = name.as_ptr().cast();
                raw.name_size = name.len();
                // Scalars have `value_size` 1; strings and lists their length.
                raw.value_size = 1;
                match value {
                    NamedValue::Int64(v) => {
                        raw.type_ = ffi::PJRT_NamedValue_kInt64;
                        raw.__bindgen_anon_1.int64_value = *v;
                    }
                    NamedValue::Str(s) => {
                        raw.type_ = ffi::PJRT_NamedValue_kString;
                        raw.__bindgen_anon_1.string_value = s.as_ptr().cast();
                        raw.value_size = s.len();
                    }
                    NamedValue::Float(v) => {
                        raw.type_ = ffi::PJRT_NamedValue_kFloat;
                        raw.__bindgen_anon_1.float_value = *v;
                    }
                    NamedValue::Bool(v) => {
                        raw.type_ = ffi::PJRT_NamedValue_kBool;
                        raw.__bindgen_anon_1.bool_value = *v;
                    }
                    NamedValue::Int64List(list) => {
                        raw.type_ = ffi::PJRT_NamedValue_kInt64List;
                        raw.__bindgen_anon_1.int64_array_value = list.as_ptr();
                        raw.value_size = list.len();
                    }
                }
                raw
            })
            .collect();
        Self { values, _borrowed: std::marker::PhantomData }
    }

    pub(crate) fn as_ptr(&self) -> *const ffi::PJRT_NamedValue {
        if self.values.is_empty() { std::ptr::null() } else { self.values.as_ptr() }
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_point_into_the_options() {
        let options = [
            ("cpu_device_count", NamedValue::Int64(4)),
            ("name", NamedValue::Str("abc".into())),
            ("list", NamedValue::Int64List(vec![1, 2, 3])),
            ("flag", NamedValue::Bool(true)),
        ];
        let raw = RawNamedValues::new(&options);
        assert_eq!(raw.len(), 4);
        // SAFETY: each union member read is the one written for that type.
        unsafe {
            let values = std::slice::from_raw_parts(raw.as_ptr(), raw.len());
            assert_eq!(values[0].type_, ffi::PJRT_NamedValue_kInt64);
            assert_eq!(values[0].__bindgen_anon_1.int64_value, 4);
            assert_eq!(values[0].name_size, "cpu_device_count".len());
            assert_eq!(values[1].value_size, 3);
            assert_eq!(*values[2].__bindgen_anon_1.int64_array_value.add(2), 3);
            assert_eq!(values[2].value_size, 3);
            assert!(values[3].__bindgen_anon_1.bool_value);
            assert_eq!(values[3].struct_size, ffi::PJRT_NamedValue_STRUCT_SIZE as usize);
        }
    }

    #[test]
    fn no_options_is_a_null_array() {
        let raw = RawNamedValues::new(&[]);
        assert!(raw.as_ptr().is_null());
        assert_eq!(raw.len(), 0);
    }
}
