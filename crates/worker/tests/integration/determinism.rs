//! A rerun of the same job on the same mesh gives bitwise the same parameters.

use crate::support;
use worker::{Slice, Trainer};

fn train(bundle: &bundle::Bundle, steps: u64) -> Vec<(String, Vec<u8>)> {
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let mut trainer = Trainer::new(slice, bundle).unwrap();
    trainer.init(3).unwrap();
    for step in 0..steps {
        let mut tokens = 0;
        for micro in 0..2 {
            let batch = support::batch(8, 4, 128, step, micro);
            tokens += batch.token_count();
            trainer.grad_step(&batch).unwrap();
        }
        let applied = trainer.apply(step + 1, 1e-3, 1.0 / tokens as f32).unwrap();
        assert!(applied.loss_sum.is_finite() && applied.grad_norm.is_finite());
    }
    trainer.download_state().unwrap()
}

#[test]
fn same_job_twice_gives_bitwise_identical_state() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(tmp.path(), "fsdp=2,tp=2", 4, 128);
    let first = train(&bundle, 4);
    let second = train(&bundle, 4);
    let initial = train(&bundle, 0);
    assert_eq!(first.len(), 3 * bundle.manifest().params.len());
    for ((name, a), (_, b)) in first.iter().zip(&second) {
        assert!(a == b, "{name} differs between two identical runs");
    }
    // Training moved the parameters, so equality above is not vacuous.
    let changed =
        first.iter().zip(&initial).filter(|((n, a), (_, b))| n.starts_with("params/") && a != b).count();
    assert_eq!(changed, bundle.manifest().params.len(), "every parameter trains");
}
