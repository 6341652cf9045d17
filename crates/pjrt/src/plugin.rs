//! Loading a plugin once per process, and the plumbing every call goes through: function-table
//! lookups that respect the plugin's table size, `PJRT_Error` conversion, and event waits.

use crate::error::{Error, ErrorCode, Result};
use crate::ffi;
use crate::host::HostBuffer;
use crate::named_value::{NamedValue, RawNamedValues};
use crate::{Client, Topology};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// A loaded PJRT plugin. Lives for the rest of the process: plugins crash when unloaded at exit,
/// so the library is never closed, and loading the same file again returns the same plugin.
pub struct Plugin {
    path: PathBuf,
    api: *const ffi::PJRT_Api,
    /// The function table's size as the plugin reports it: fields past it do not exist.
    api_size: usize,
    version: (i32, i32),
    /// Kept only so the library is never unloaded (the `Plugin` itself is leaked).
    _library: libloading::Library,
}

// SAFETY: the PJRT function table is immutable after `GetPjrtApi` and the C API requires its
// functions to be callable from any thread.
unsafe impl Send for Plugin {}
// SAFETY: as above; `Plugin` has no interior mutability.
unsafe impl Sync for Plugin {}

/// Plugins loaded so far, by canonical path.
static LOADED: OnceLock<Mutex<HashMap<PathBuf, &'static Plugin>>> = OnceLock::new();

impl Plugin {
    /// Loads the plugin at `path` (once per process per canonical path), checks its API version
    /// and runs `PJRT_Plugin_Initialize`.
    pub fn load(path: impl AsRef<Path>) -> Result<&'static Plugin> {
        let path = path.as_ref();
        let canonical = std::fs::canonicalize(path)
            .map_err(|source| Error::PluginNotFound { path: path.to_path_buf(), source })?;
        // Holding the lock across dlopen and initialization keeps a concurrent load of the same
        // file from initializing the plugin twice.
        let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plugin) = loaded.get(&canonical) {
            return Ok(plugin);
        }
        let plugin: &'static Plugin = Box::leak(Box::new(Self::open(canonical.clone())?));
        plugin.initialize()?;
        loaded.insert(canonical, plugin);
        Ok(plugin)
    }

    fn open(path: PathBuf) -> Result<Plugin> {
        // SAFETY: loading a shared library runs its initializers; a PJRT plugin's are what its
        // vendor ships, and the path was chosen by the caller to be one.
        let library = unsafe { libloading::Library::new(&path) }
            .map_err(|e| Error::PluginLoad { path: path.clone(), message: e.to_string() })?;
        type GetPjrtApi = unsafe extern "C" fn() -> *const ffi::PJRT_Api;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api = unsafe { library.get::<GetPjrtApi>(b"GetPjrtApi\0") }.map_err(|e| {
            Error::NotAPlugin { path: path.clone(), reason: format!("it does not export GetPjrtApi ({e})") }
        })?;
        // SAFETY: the plugin returns a pointer to a static table, or null.
        let api = unsafe { get_api() };
        if api.is_null() {
            return Err(Error::NotAPlugin { path, reason: "GetPjrtApi returned null".into() });
        }
        // SAFETY: every table starts with `struct_size`, `extension_start` and the version.
        let (api_size, version) = unsafe {
            let head = &*api;
            (head.struct_size, (head.pjrt_api_version.major_version, head.pjrt_api_version.minor_version))
        };
        check_version(&path, version)?;
        Ok(Plugin { path, api, api_size, version, _library: library })
    }

    fn initialize(&self) -> Result<()> {
        let mut args = new_args!(PJRT_Plugin_Initialize_Args);
        // SAFETY: `args` is a valid, sized argument struct.
        self.check(unsafe { call!(self, PJRT_Plugin_Initialize)(&mut args) }, "PJRT_Plugin_Initialize")
    }

    /// The plugin's PJRT C API version, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// The canonical path the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates a client; `options` are plugin-specific, e.g. `("cpu_device_count", Int64(4))`.
    pub fn create_client(&'static self, options: &[(&str, NamedValue)]) -> Result<Client> {
        Client::create(self, options)
    }

    /// Creates a device topology without a client (e.g. libtpu's `"v6e:2x4"`), for compiling
    /// ahead of time on a machine that does not have those devices.
    pub fn topology(&'static self, name: &str, options: &[(&str, NamedValue)]) -> Result<Topology> {
        let raw_options = RawNamedValues::new(options);
        let mut args = new_args!(PJRT_TopologyDescription_Create_Args);
        args.topology_name = name.as_ptr().cast();
        args.topology_name_size = name.len();
        args.create_options = raw_options.as_ptr();
        args.num_options = raw_options.len();
        // SAFETY: the name and options outlive the call.
        self.check(
            unsafe { call!(self, PJRT_TopologyDescription_Create)(&mut args) },
            "PJRT_TopologyDescription_Create",
        )?;
        Ok(Topology::from_raw(self, args.topology))
    }

    /// The function table. Fields past `api_size` must not be read: use [`call!`].
    pub(crate) fn table(&self) -> &ffi::PJRT_Api {
        // SAFETY: the plugin keeps its table alive for the life of the (never unloaded) library;
        // `call!` checks `api_size` before reading any function field.
        unsafe { &*self.api }
    }

    /// Whether the plugin's table reaches the field at `offset` (of pointer size).
    pub(crate) fn has_field(&self, offset: usize) -> bool {
        offset + std::mem::size_of::<usize>() <= self.api_size
    }

    pub(crate) fn missing(&self, function: &'static str) -> Error {
        Error::MissingFunction { function, major: self.version.0, minor: self.version.1 }
    }

    /// Turns a returned `PJRT_Error*` into a `Result`, destroying the error.
    pub(crate) fn check(&self, error: *mut ffi::PJRT_Error, function: &'static str) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        let table = self.table();
        let mut message_args = new_args!(PJRT_Error_Message_Args);
        message_args.error = error;
        let mut code_args = new_args!(PJRT_Error_GetCode_Args);
        code_args.error = error;
        let mut destroy_args = new_args!(PJRT_Error_Destroy_Args);
        destroy_args.error = error;
        // SAFETY: the three error functions are in every table since API 0.1; `error` is live
        // until destroyed last, and the message is copied before that.
        unsafe {
            let message = match table.PJRT_Error_Message {
                Some(message_fn) => {
                    message_fn(&mut message_args);
                    string_from(message_args.message, message_args.message_size)
                }
                None => String::from("(no message)"),
            };
            let code = match table.PJRT_Error_GetCode {
                Some(code_fn) => {
                    // GetCode returns an error only for an invalid argument, which `error` is not.
                    code_fn(&mut code_args);
                    ErrorCode::from_raw(code_args.code)
                }
                None => ErrorCode::Unknown,
            };
            if let Some(destroy) = table.PJRT_Error_Destroy {
                destroy(&mut destroy_args);
            }
            Err(Error::Pjrt { function, code, message })
        }
    }

    /// Waits for `event`, then destroys it; returns the event's error, if any.
    pub(crate) fn await_event(&self, event: *mut ffi::PJRT_Event, function: &'static str) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut await_args = new_args!(PJRT_Event_Await_Args);
        await_args.event = event;
        // SAFETY: `event` was returned by the plugin and not destroyed yet.
        let awaited = self.check(unsafe { call!(self, PJRT_Event_Await)(&mut await_args) }, function);
        let destroyed = self.destroy_event(event);
        awaited.and(destroyed)
    }

    /// Keeps `data` until `event` (a host buffer's done event) fires, then drops it on the
    /// thread that fires it; destroys the event handle now (the registration outlives it). A
    /// null event means the plugin is already done with the memory.
    pub(crate) fn release_when_done(
        &'static self,
        event: *mut ffi::PJRT_Event,
        data: HostBuffer,
    ) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        unsafe extern "C" fn release(error: *mut ffi::PJRT_Error, user_arg: *mut std::ffi::c_void) {
            // SAFETY: `user_arg` is the box leaked below, and the plugin calls this exactly once.
            let held = unsafe { Box::from_raw(user_arg.cast::<Held>()) };
            if let Err(error) = held.plugin.check(error, "PJRT_Event_OnReady") {
                // The memory is released either way: the buffer it backed is gone or was never made.
                tracing::warn!(%error, "a host buffer's done event carried an error");
            }
        }
        struct Held {
            plugin: &'static Plugin,
            _data: HostBuffer,
        }
        let user_arg = Box::into_raw(Box::new(Held { plugin: self, _data: data }));
        let mut args = new_args!(PJRT_Event_OnReady_Args);
        args.event = event;
        args.callback = Some(release);
        args.user_arg = user_arg.cast();
        // SAFETY: `event` is live; the callback owns `user_arg` from here on and takes the error.
        let registered = function!(self, PJRT_Event_OnReady)
            .and_then(|on_ready| self.check(unsafe { on_ready(&mut args) }, "PJRT_Event_OnReady"));
        if registered.is_err() {
            // Not registered, so never called: the memory may still back the buffer, so it is
            // leaked rather than freed under it.
            tracing::warn!("could not register a host buffer's release; its memory stays allocated");
        }
        let destroyed = self.destroy_event(event);
        registered.and(destroyed)
    }

    pub(crate) fn destroy_event(&self, event: *mut ffi::PJRT_Event) -> Result<()> {
        let mut args = new_args!(PJRT_Event_Destroy_Args);
        args.event = event;
        // SAFETY: `event` was returned by the plugin and is destroyed exactly once.
        self.check(unsafe { call!(self, PJRT_Event_Destroy)(&mut args) }, "PJRT_Event_Destroy")
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("path", &self.path).field("api_version", &self.version).finish()
    }
}

/// Accepts any minor version of the header's major one: argument structs carry their size, so
/// older and newer plugins read what they know; missing functions are caught per call.
fn check_version(path: &Path, (major, minor): (i32, i32)) -> Result<()> {
    if major == ffi::PJRT_API_MAJOR as i32 {
        return Ok(());
    }
    Err(Error::ApiVersionMismatch {
        path: path.to_path_buf(),
        plugin_major: major,
        plugin_minor: minor,
        major: ffi::PJRT_API_MAJOR,
        minor: ffi::PJRT_API_MINOR,
    })
}

/// Copies a (pointer, length) string the plugin owns; invalid UTF-8 is replaced, not refused.
///
/// # Safety
/// `data` must point to `len` readable bytes, or be null.
pub(crate) unsafe fn string_from(data: *const std::os::raw::c_char, len: usize) -> String {
    if data.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies a (pointer, length) array the plugin owns.
///
/// # Safety
/// `data` must point to `len` readable elements, or be null.
pub(crate) unsafe fn slice_from<'a, T>(data: *const T, len: usize) -> &'a [T] {
    if data.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(data, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_a_typed_error() {
        let error = Plugin::load("/nonexistent/libnothing.so").unwrap_err();
        assert!(matches!(error, Error::PluginNotFound { .. }), "{error}");
        assert!(error.to_string().contains("/nonexistent/libnothing.so"), "{error}");
    }

    #[test]
    fn a_file_that_is_not_a_library_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.so");
        std::fs::write(&path, b"not an ELF file").unwrap();
        let error = Plugin::load(&path).unwrap_err();
        assert!(matches!(error, Error::PluginLoad { .. }), "{error}");
    }

    #[test]
    fn only_the_major_version_must_match() {
        let path = Path::new("/plugins/pjrt.so");
        assert!(check_version(path, (0, 81)).is_ok());
        assert!(check_version(path, (0, 115)).is_ok());
        let error = check_version(path, (1, 2)).unwrap_err();
        assert!(matches!(error, Error::ApiVersionMismatch { plugin_major: 1, .. }));
        assert_eq!(
            error.to_string(),
            "/plugins/pjrt.so implements PJRT C API 1.2, but podctl-pjrt was built against 0.81; \
             use a plugin of major version 0"
        );
    }

    #[test]
    fn strings_from_null_are_empty() {
        // SAFETY: null is allowed.
        assert_eq!(unsafe { string_from(std::ptr::null(), 5) }, "");
        // SAFETY: null is allowed.
        assert!(unsafe { slice_from::<i64>(std::ptr::null(), 3) }.is_empty());
    }
}
