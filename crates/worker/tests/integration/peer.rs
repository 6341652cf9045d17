//! Peer catch-up between two real CPU slices: the state arrives bitwise whole on the puller's
//! devices, each piece straight into memory a device takes over; refusals say why; a cancel
//! ends a pull at once, an interruption a serve window, and a corrupt piece is refused.

use crate::support;
use bundle::TensorSpec;
use mesh::{DType, IciMesh, Sharding};
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use worker::Slice;
use worker::peer::{self, Cancel, Layout, PeerError, Request, StateServer};

fn spec(name: &str, shape: &[u64], sharding: Vec<Vec<String>>) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        shape: shape.to_vec(),
        dtype: DType::Float32,
        sharding: Sharding::new(sharding),
        donated: false,
        memory_kind: None,
    }
}

/// A state with an array split over both devices, one split on its last dimension, and one
/// replicated on both (sent once).
fn specs() -> Vec<TensorSpec> {
    let fsdp = || vec!["fsdp".to_string()];
    vec![
        spec("params/w", &[8, 6], vec![fsdp(), vec![]]),
        spec("params/b", &[6], vec![vec![]]),
        spec("opt/mu/w", &[8, 6], vec![vec![], fsdp()]),
    ]
}

fn mesh() -> IciMesh {
    IciMesh::new([("fsdp", 2)]).unwrap()
}

fn values(index: usize, spec: &TensorSpec) -> Vec<u8> {
    let n = spec.shape.iter().product::<u64>() as usize;
    (0..n).flat_map(|i| (index as f32 * 1000.0 + i as f32).to_le_bytes()).collect()
}

fn request(worker: &str, step: u64) -> Request {
    Request { job: "job".into(), step, worker: worker.into() }
}

#[test]
fn a_pulled_state_arrives_whole_on_the_pullers_devices() {
    let (survivor, replacement) = (
        Slice::open(support::plugin(), "cpu", &mesh()).unwrap(),
        Slice::open(support::plugin(), "cpu", &mesh()).unwrap(),
    );
    let specs = specs();
    let held: Vec<_> =
        specs.iter().enumerate().map(|(i, s)| survivor.upload(s, &values(i, s)).unwrap()).collect();
    let layout = Layout::new(&specs, survivor.mesh());
    assert_eq!(layout.pieces.len(), 5, "two halves of each split array, the replicated one once");
    let sources: Vec<&pjrt::Buffer> =
        layout.pieces.iter().map(|p| held[p.array].shard(p.device).unwrap()).collect();

    let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let window = server.open("job", 7, &layout, &["w2".to_string()]);
    let (arrays, pulled, served) = std::thread::scope(|scope| {
        let serving = scope.spawn(|| {
            peer::serve(&window, &layout, &sources, &["w2".to_string()], Duration::from_secs(30), &|| false)
        });
        let (arrays, pulled) = peer::pull(
            server.local_addr(),
            &request("w2", 7),
            &replacement,
            &specs,
            Duration::from_secs(30),
            &Cancel::default(),
        )
        .unwrap();
        (arrays, pulled, serving.join().unwrap().unwrap())
    });
    assert_eq!(pulled.bytes, layout.bytes());
    assert_eq!(served.pulls.len(), 1);
    assert_eq!((served.pulls[0].0.as_str(), served.pulls[0].1), ("w2", layout.bytes()));
    for (i, (spec, array)) in specs.iter().zip(&arrays).enumerate() {
        assert_eq!(replacement.download(spec, array).unwrap(), values(i, spec), "{}", spec.name);
    }
}

#[test]
fn refusals_say_why_and_another_layout_is_not_retried() {
    let slice = Slice::open(support::plugin(), "cpu", &mesh()).unwrap();
    let specs = specs();
    let layout = Layout::new(&specs, slice.mesh());
    let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let pull = |worker: &str, step: u64, specs: &[TensorSpec], wait: Duration| {
        peer::pull(server.local_addr(), &request(worker, step), &slice, specs, wait, &Cancel::default())
            .map(|_| ())
            .unwrap_err()
    };
    let e = pull("w2", 7, &specs, Duration::ZERO);
    assert!(matches!(&e, PeerError::Refused { reason, .. } if reason.contains("offers no state now")), "{e}");
    let _window = server.open("job", 6, &layout, &["w2".to_string()]);
    let e = pull("w2", 7, &specs, Duration::ZERO);
    assert!(e.to_string().contains("holds step 6, not 7"), "{e}");
    let e = pull("w3", 6, &specs, Duration::ZERO);
    assert!(e.to_string().contains("does not expect w3"), "{e}");
    // Another bundle's state: refused at once, however long the puller would wait.
    let mut other = specs.clone();
    other[1].shape = vec![7];
    let started = Instant::now();
    let e = pull("w2", 6, &other, Duration::from_secs(60));
    assert!(matches!(e, PeerError::Incompatible { .. }), "{e}");
    assert!(e.to_string().contains("different bundles"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "retried for {:?}", started.elapsed());
}

#[test]
fn a_pull_waits_for_the_window_and_a_cancel_ends_it() {
    let (survivor, replacement) = (
        Slice::open(support::plugin(), "cpu", &mesh()).unwrap(),
        Slice::open(support::plugin(), "cpu", &mesh()).unwrap(),
    );
    let specs = specs();
    let held: Vec<_> =
        specs.iter().enumerate().map(|(i, s)| survivor.upload(s, &values(i, s)).unwrap()).collect();
    let layout = Layout::new(&specs, survivor.mesh());
    let sources: Vec<&pjrt::Buffer> =
        layout.pieces.iter().map(|p| held[p.array].shard(p.device).unwrap()).collect();
    let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    // The survivor opens its window after the puller started asking.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            let window = server.open("job", 3, &layout, &["w2".to_string()]);
            peer::serve(&window, &layout, &sources, &["w2".to_string()], Duration::from_secs(30), &|| false)
                .unwrap();
        });
        let (_, pulled) = peer::pull(
            server.local_addr(),
            &request("w2", 3),
            &replacement,
            &specs,
            Duration::from_secs(30),
            &Cancel::default(),
        )
        .unwrap();
        assert!(pulled.retries > 0, "the first attempts came before the window opened");
    });
    // Nobody serves step 4: a cancel ends the wait at once.
    let cancel = Cancel::default();
    let started = Instant::now();
    let e = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            cancel.cancel();
        });
        peer::pull(
            server.local_addr(),
            &request("w2", 4),
            &replacement,
            &specs,
            Duration::from_secs(60),
            &cancel,
        )
        .map(|_| ())
        .unwrap_err()
    });
    assert!(matches!(e, PeerError::Cancelled { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "the cancel took {:?}", started.elapsed());
}

#[test]
fn a_serve_window_ends_when_interrupted_or_when_nobody_pulls() {
    let slice = Slice::open(support::plugin(), "cpu", &mesh()).unwrap();
    let specs = specs();
    let held: Vec<_> =
        specs.iter().enumerate().map(|(i, s)| slice.upload(s, &values(i, s)).unwrap()).collect();
    let layout = Layout::new(&specs, slice.mesh());
    let sources: Vec<&pjrt::Buffer> =
        layout.pieces.iter().map(|p| held[p.array].shard(p.device).unwrap()).collect();
    let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let pullers = ["w2".to_string()];
    let window = server.open("job", 3, &layout, &pullers);
    let started = Instant::now();
    let interrupted = || started.elapsed() > Duration::from_millis(300);
    let e =
        peer::serve(&window, &layout, &sources, &pullers, Duration::from_secs(60), &interrupted).unwrap_err();
    assert!(matches!(e, PeerError::Interrupted), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let e =
        peer::serve(&window, &layout, &sources, &pullers, Duration::from_millis(300), &|| false).unwrap_err();
    assert!(matches!(&e, PeerError::NotPulled { missing, .. } if missing == &pullers), "{e}");
    drop(window);
    let e = peer::pull(
        server.local_addr(),
        &request("w2", 3),
        &slice,
        &specs,
        Duration::ZERO,
        &Cancel::default(),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(e.to_string().contains("offers no state now"), "the window closed: {e}");
}

#[test]
fn a_piece_that_arrives_corrupt_is_refused() {
    let slice = Slice::open(support::plugin(), "cpu", &mesh()).unwrap();
    let specs = vec![spec("params/b", &[6], vec![vec![]])];
    // A peer that answers with the right header and the wrong CRC.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let liar = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 64];
        let _ = stream.read(&mut request).unwrap();
        let mut answer = vec![0u8];
        answer.extend_from_slice(&0u32.to_le_bytes());
        answer.extend_from_slice(&0u32.to_le_bytes());
        answer.extend_from_slice(&24u64.to_le_bytes());
        answer.extend_from_slice(&[7u8; 24]);
        answer.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        stream.write_all(&answer).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let e = peer::pull(addr, &request("w2", 1), &slice, &specs, Duration::from_secs(30), &Cancel::default())
        .map(|_| ())
        .unwrap_err();
    liar.join().unwrap();
    assert!(matches!(e, PeerError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("the stream was corrupted"), "{e}");
}
