//! Regions of every parameter read in the groups `shared_reads` forms (and all at once) equal
//! the same regions read one by one, on several meshes; groups share their source rows.

use crate::common::{fixture, open};
use mesh::{DType, IciMesh, Region};

#[tokio::test]
async fn grouped_reads_equal_single_reads() {
    let model = open(&fixture("untied-bf16")).await.unwrap();
    for (fsdp, tp) in [(2, 2), (4, 1), (1, 4), (2, 1)] {
        let mesh = IciMesh::new([("fsdp", fsdp), ("tp", tp)]).unwrap();
        for p in model.model().params() {
            let mut regions: Vec<Region> = Vec::new();
            for d in 0..mesh.num_devices() {
                let region = p.sharding.shard_region(&p.shape, &mesh, d);
                if !regions.contains(&region) {
                    regions.push(region);
                }
            }
            let mut alone = Vec::new();
            for region in &regions {
                alone.push(
                    model
                        .read_regions(p.path, &p.shape, DType::Float32, std::slice::from_ref(region))
                        .await
                        .unwrap()
                        .remove(0),
                );
            }
            let groups = model.shared_reads(p.path, &regions);
            assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), regions.len());
            if p.path == "layers/q_proj" && fsdp == 2 && tp == 2 {
                // Devices differing in fsdp (the columns of [out, in]) share the rows.
                assert_eq!(groups, [vec![0, 2], vec![1, 3]], "{p:?}");
            }
            for group in &groups {
                let wanted: Vec<Region> = group.iter().map(|&i| regions[i].clone()).collect();
                let together = model.read_regions(p.path, &p.shape, DType::Float32, &wanted).await.unwrap();
                for (&i, bytes) in group.iter().zip(&together) {
                    assert!(
                        *bytes == alone[i],
                        "{} on ({fsdp},{tp}) region {:?}",
                        p.path,
                        regions[i].ranges()
                    );
                }
            }
            let all = model.read_regions(p.path, &p.shape, DType::Float32, &regions).await.unwrap();
            assert!(all == alone, "{} on ({fsdp},{tp}) all at once", p.path);
        }
    }
}
