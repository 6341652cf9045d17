//! Which device of which host holds which shard of each parameter: what `podctl launch
//! --dry-run` prints to explain a layout before anything runs.

use crate::shapes::ParamShape;
use crate::workload::Layout;
use mesh::{DType, Region};
use std::fmt::Write;

/// `[0:512, :]`: each dimension's range, `:` where the device holds all of it.
fn region_text(region: &Region, shape: &[u64]) -> String {
    let dims: Vec<String> = region
        .ranges()
        .iter()
        .zip(shape)
        .map(
            |(r, &size)| {
                if r.start == 0 && r.end == size { ":".into() } else { format!("{}:{}", r.start, r.end) }
            },
        )
        .collect();
    format!("[{}]", dims.join(", "))
}

fn bytes_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn shape_text(shape: &[u64]) -> String {
    shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// The layout of `params` (in `dtype`) over `layout`: a device map of one host, then for each
/// parameter its sharding and, per distinct shard, the devices that hold it and the region of
/// the global array it covers. Every host holds the same shards on the same devices (the `dcn`
/// axis replicates), so one host's map is the whole story; the text says how hosts number.
pub fn render_layout(layout: &Layout, params: &[ParamShape], dtype: DType) -> String {
    let mesh = layout.ici_mesh();
    let devices = layout.devices_per_slice();
    let mut out = String::new();
    let coords: Vec<String> =
        (0..devices).map(|d| format!("{d}=({},{})", d / layout.tp, d % layout.tp)).collect();
    let _ = writeln!(out, "devices of each host at (fsdp, tp): {}", coords.join(" "));
    if layout.dcn > 1 {
        let _ = writeln!(
            out,
            "hosts 0..{} hold the same shards: device d of host h is device h x {devices} + d of the job",
            layout.dcn - 1
        );
    }
    let width = params.iter().map(|p| p.path.len()).max().unwrap_or(0);
    for p in params {
        let header = format!("{:<width$}  {dtype}[{}]  {}", p.path, shape_text(&p.shape), p.sharding);
        if let Err(error) = p.sharding.validate(&p.shape, &mesh) {
            let _ = writeln!(out, "{header}: cannot be laid out: {error}");
            continue;
        }
        let shard = p.sharding.shard_shape(&p.shape, &mesh);
        let bytes = shard.iter().product::<u64>() * dtype.size() as u64;
        let _ = writeln!(out, "{header}  shard [{}] {} per device", shape_text(&shard), bytes_text(bytes));
        // Devices holding the same region, in order of the first device of each.
        let mut groups: Vec<(Region, Vec<usize>)> = Vec::new();
        for device in 0..devices {
            let region = p.sharding.shard_region(&p.shape, &mesh, device);
            match groups.iter_mut().find(|(r, _)| *r == region) {
                Some((_, holders)) => holders.push(device),
                None => groups.push((region, vec![device])),
            }
        }
        if groups.len() == 1 {
            let _ = writeln!(out, "  every device: the whole array");
            continue;
        }
        for (region, holders) in groups {
            let names: Vec<String> = holders.iter().map(usize::to_string).collect();
            let label = if holders.len() == 1 { "device" } else { "devices" };
            let _ = writeln!(out, "  {label} {}: {}", names.join(","), region_text(&region, &p.shape));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::param_shapes;

    fn qwen3_layout(dcn: usize, fsdp: usize, tp: usize) -> String {
        let model = bundle::preset("qwen3-1.7b").unwrap();
        render_layout(&Layout { dcn, fsdp, tp }, &param_shapes(&model), DType::Float32)
    }

    #[test]
    fn two_hosts_of_fsdp_4_tp_2_name_every_shard() {
        let text = qwen3_layout(2, 4, 2);
        assert!(text.starts_with("devices of each host at (fsdp, tp): 0=(0,0) 1=(0,1) 2=(1,0)"), "{text}");
        assert!(text.contains("7=(3,1)\n"), "{text}");
        assert!(text.contains("device d of host h is device h x 8 + d of the job"), "{text}");
        // The embedding is split (tp, fsdp): vocabulary rows over tp, hidden columns over fsdp.
        assert!(text.contains("embed "), "{text}");
        assert!(
            text.contains("float32[151936, 2048]  P(tp, fsdp)  shard [75968, 512] 148.4 MiB per device"),
            "{text}"
        );
        assert!(text.contains("  device 0: [0:75968, 0:512]\n  device 1: [75968:151936, 0:512]\n"), "{text}");
        assert!(text.contains("  device 7: [75968:151936, 1536:2048]\n"), "{text}");
        // Stacked layers keep the layer axis whole; q_proj splits its input over fsdp, its heads over tp.
        assert!(text.contains("  device 3: [:, 512:1024, 1024:2048]\n"), "{text}");
        // Norms are replicated.
        assert!(text.contains("final_norm"), "{text}");
        let after_final = &text[text.find("final_norm").unwrap()..];
        assert!(after_final.contains("\n  every device: the whole array"), "{text}");
    }

    #[test]
    fn devices_holding_the_same_shard_are_grouped() {
        // Split over fsdp only: the two tp devices of each fsdp row hold the same rows.
        let text = render_layout(
            &Layout { dcn: 1, fsdp: 2, tp: 2 },
            &[ParamShape {
                path: "w",
                shape: vec![4, 6],
                sharding: mesh::Sharding::new(vec![vec!["fsdp".into()], vec![]]),
                per_layer: false,
            }],
            DType::Bfloat16,
        );
        assert!(!text.contains("hosts 0.."), "{text}");
        assert!(text.contains("w  bfloat16[4, 6]  P(fsdp, None)  shard [2, 6] 24 B per device\n"), "{text}");
        assert!(text.ends_with("  devices 0,1: [0:2, :]\n  devices 2,3: [2:4, :]\n"), "{text}");
    }

    #[test]
    fn a_sharding_that_does_not_divide_says_so() {
        let text = render_layout(
            &Layout { dcn: 1, fsdp: 1, tp: 4 },
            &[ParamShape {
                path: "odd",
                shape: vec![6],
                sharding: mesh::Sharding::new(vec![vec!["tp".into()]]),
                per_layer: false,
            }],
            DType::Float32,
        );
        assert!(text.contains("odd  float32[6]  P(tp): cannot be laid out:"), "{text}");
    }
}
