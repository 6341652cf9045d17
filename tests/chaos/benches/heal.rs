//! Heal at wire speed: how fast a replacement pulls the train state from a live peer, beside
//! the loopback TCP limit measured in the same run, and the memory the pull adds.
//!
//! Part 1, the wire (`--wire-gb`, 1 GB by default): in this process, a state of float32 arrays
//! on one CPU slice's device moves to another slice's over loopback, each way in turn, over
//! `--rounds` rounds that alternate the order:
//! - `tcp`: a buffer to a buffer over one connection, nothing else: the kernel's limit (both
//!   buffers stay in the CPU's caches);
//! - `tcp-mem`: the same connection from the survivor's device memory into fresh memory the
//!   replacement's device takes over, no framing and no check: what any transfer of the state
//!   must also pay, the memory traffic (reading the state, first touch of the new pages);
//! - `podctl`: `worker::peer` (its own framing, each piece read into memory its device takes
//!   over, CRC32C on both sides), what a replacement runs;
//! - `codec`: tokio-util's `LengthDelimitedCodec`, frames of 1 MiB copied out of the device
//!   memory into the codec and out of the frames into the device's memory, CRC32C;
//! - `tonic`: a server-streaming gRPC of 1 MiB messages over HTTP/2 (windows of 16 MiB),
//!   copied the same two ways, CRC32C.
//!
//! Part 2, a job (`--job-gb`, about 4.1 GB by default; `--skip-job` leaves it out):
//! `podctl launch` of a 2-slice job of a Qwen3-shaped model (Qwen3-0.6B's widths, as many
//! layers as make the state that size; random bf16 weights written here), parameters and AdamW
//! moments in float32. Once it trains, slice 1's worker is SIGKILLed; the launcher starts a
//! replacement, which pulls the state from slice 0's worker. Its log line gives the bytes, the
//! seconds on the wire and the peak memory the pull added (reset before it, read after). The
//! raw TCP limit is measured again right before the kill.
//!
//! `cargo bench -p podctl-chaos --bench heal [-- --wire-gb 0.5 --job-gb 0.5 --rounds 3 --ways podctl,codec]`.
//! Needs about 3.5x `--job-gb` of free memory for part 2; every file goes at the end.

use anyhow::{Context, Result, bail};
use bundle::TensorSpec;
use bytes::{Buf, BufMut, Bytes};
use futures::{SinkExt, StreamExt};
use mesh::{DType, IciMesh, Sharding};
use pjrt::HostBuffer;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use worker::Slice;
use worker::peer::{self, Cancel, Layout, Request, StateServer};

const SEGMENT: usize = 1 << 20;
const GB: f64 = 1e9;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let number = |name: &str, default: f64| {
        flag(name).map_or(Ok(default), |v| v.parse::<f64>()).context(name.to_string())
    };
    let wire_gb = number("--wire-gb", 1.0)?;
    let job_gb = number("--job-gb", 4.1)?;
    let rounds = number("--rounds", 3.0)? as usize;
    let home = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize()?;
    println!("heal benchmark, load average {}", load());
    if !args.iter().any(|a| a == "--skip-wire") {
        // `--ways podctl,tcp-mem` runs only those (to profile one); the limit is always measured.
        let ways: Vec<Way> = match flag("--ways") {
            Some(list) => WAYS
                .into_iter()
                .filter(|w| *w == Way::Tcp || list.split(',').any(|n| n == w.name()))
                .collect(),
            None => WAYS.to_vec(),
        };
        wire(&home, wire_gb, rounds, &ways)?;
    }
    if !args.iter().any(|a| a == "--skip-job") {
        job(&home, job_gb)?;
    }
    Ok(())
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "?".into(), |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn plugin(home: &Path) -> &'static pjrt::Plugin {
    let path = home.join(".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so");
    pjrt::Plugin::load(&path).expect("the CPU plugin loads (scripts/setup.sh installs it)")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

// ---------------------------------------------------------------- part 1: the wire

/// Float32 arrays of 64 MiB (the last one shorter) making `gb` GB, replicated on one device.
fn wire_specs(gb: f64) -> Vec<TensorSpec> {
    let total = (gb * GB) as u64 / 4;
    let per = 16u64 << 20;
    (0..total.div_ceil(per))
        .map(|i| TensorSpec {
            name: format!("params/w{i:03}"),
            shape: vec![(per.min(total - i * per)) / 1024, 1024],
            dtype: DType::Float32,
            sharding: Sharding::replicated(2),
            donated: false,
            memory_kind: None,
        })
        .filter(|s| s.shape[0] > 0)
        .collect()
}

fn filled(len: usize, seed: u64) -> HostBuffer {
    let mut buffer = HostBuffer::zeroed(len).expect("host memory");
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    for word in buffer.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
    buffer
}

/// One way of moving the state, timed from the first byte asked for to the last one placed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Tcp,
    TcpMem,
    Podctl,
    Codec,
    Tonic,
}

const WAYS: [Way; 5] = [Way::Tcp, Way::TcpMem, Way::Podctl, Way::Codec, Way::Tonic];

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Tcp => "tcp",
            Way::TcpMem => "tcp-mem",
            Way::Podctl => "podctl",
            Way::Codec => "codec",
            Way::Tonic => "tonic",
        }
    }
}

fn wire(home: &Path, gb: f64, rounds: usize, ways: &[Way]) -> Result<()> {
    let mesh = IciMesh::new([("fsdp", 1)])?;
    let survivor = Slice::open(plugin(home), "cpu", &mesh)?;
    let replacement = Slice::open(plugin(home), "cpu", &mesh)?;
    let specs = wire_specs(gb);
    let held: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| survivor.upload_each(s, |_, r| Ok(filled(r.num_elements() as usize * 4, i as u64))))
        .collect::<Result<_, _>>()?;
    let layout = Layout::new(&specs, &mesh);
    let sources: Vec<&pjrt::Buffer> =
        layout.pieces.iter().map(|p| held[p.array].shard(p.device).expect("one device")).collect();
    let views: Vec<&[u8]> =
        sources.iter().map(|b| b.host_view().ok().flatten().expect("CPU memory")).collect();
    let bytes = layout.bytes();
    println!(
        "part 1, the wire: {} float32 arrays, {:.2} GB, one CPU device to another over loopback, {rounds} rounds",
        specs.len(),
        bytes as f64 / GB
    );
    let mut times: Vec<(Way, Vec<f64>)> = ways.iter().map(|w| (*w, Vec::new())).collect();
    for round in 0..rounds {
        let mut order = ways.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut line = format!("round {}: load {}", round + 1, load());
        for way in order {
            let seconds = match way {
                Way::Tcp => tcp(bytes)?,
                Way::TcpMem => tcp_mem(&layout, &views, &replacement, &specs)?,
                Way::Podctl => via_podctl(&layout, &sources, &replacement, &specs)?,
                Way::Codec => via_codec(&layout, &views, &replacement, &specs)?,
                Way::Tonic => via_tonic(&layout, &views, &replacement, &specs)?,
            };
            line += &format!("  {} {:.2} GB/s", way.name(), bytes as f64 / GB / seconds);
            times.iter_mut().find(|(w, _)| *w == way).expect("every way").1.push(seconds);
        }
        println!("{line}");
    }
    let limit = bytes as f64 / GB / median(times[0].1.clone());
    println!("medians over {rounds} rounds (load average now {}):", load());
    for (way, seconds) in &times {
        let rate = bytes as f64 / GB / median(seconds.clone());
        let what = match way {
            Way::Tcp => "loopback TCP, buffer to buffer (the limit)",
            Way::TcpMem => "loopback TCP, state memory into fresh memory (no framing)",
            Way::Podctl => "podctl peer pull (own framing, into device memory, CRC32C)",
            Way::Codec => "tokio-util LengthDelimitedCodec (+ a copy each side, CRC32C)",
            Way::Tonic => "tonic server streaming (+ a copy each side, CRC32C)",
        };
        println!("{what:<62} {rate:>6.2} GB/s  {:>4.0}% of the limit", 100.0 * rate / limit);
    }
    Ok(())
}

/// Raw loopback TCP: a 4 MiB buffer written until `bytes` went, read into a 4 MiB buffer.
fn tcp(bytes: u64) -> Result<f64> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut stream = std::net::TcpStream::connect(addr)?;
        let buffer = vec![7u8; 4 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buffer.len() as u64) as usize;
            stream.write_all(&buffer[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let (mut stream, _) = listener.accept()?;
    let started = Instant::now();
    let mut buffer = vec![0u8; 4 << 20];
    let mut got = 0u64;
    while got < bytes {
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            bail!("the writer stopped after {got} bytes");
        }
        got += n as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    writer.join().expect("writer")?;
    Ok(seconds)
}

/// Raw loopback TCP from the survivor's device memory into fresh memory per piece, placed on
/// the replacement's device: the memory traffic of a transfer without its framing or CRC.
fn tcp_mem(layout: &Layout, views: &[&[u8]], to: &Slice, specs: &[TensorSpec]) -> Result<f64> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> std::io::Result<()> {
            let (mut stream, _) = listener.accept()?;
            for view in views {
                stream.write_all(view)?;
            }
            Ok(())
        });
        let started = Instant::now();
        let mut stream = std::net::TcpStream::connect(addr)?;
        let mut receiving = Receiving::new(layout);
        for piece in &layout.pieces {
            let mut buffer = HostBuffer::zeroed(piece.bytes)?;
            stream.read_exact(&mut buffer)?;
            receiving.pieces.push(buffer);
        }
        receiving.place(to, specs)?;
        let seconds = started.elapsed().as_secs_f64();
        writer.join().expect("writer")?;
        Ok(seconds)
    })
}

fn via_podctl(layout: &Layout, sources: &[&pjrt::Buffer], to: &Slice, specs: &[TensorSpec]) -> Result<f64> {
    let server = StateServer::bind("127.0.0.1:0".parse()?)?;
    let pullers = ["replacement".to_string()];
    let window = server.open("bench", 1, layout, &pullers);
    let request = Request { job: "bench".into(), step: 1, worker: "replacement".into() };
    std::thread::scope(|scope| {
        let serving = scope
            .spawn(|| peer::serve(&window, layout, sources, &pullers, Duration::from_secs(600), &|| false));
        let started = Instant::now();
        let (arrays, _) = peer::pull(
            server.local_addr(),
            &request,
            to,
            specs,
            Duration::from_secs(600),
            &Cancel::default(),
        )?;
        let seconds = started.elapsed().as_secs_f64();
        drop(arrays);
        serving.join().expect("server")?;
        Ok(seconds)
    })
}

/// Receives a piece's bytes by copying frames or messages into memory the device takes over,
/// checking the CRC the last 4 bytes carry; then places the state.
struct Receiving<'a> {
    layout: &'a Layout,
    pieces: Vec<HostBuffer>,
    current: Option<(HostBuffer, usize, u32)>,
}

impl<'a> Receiving<'a> {
    fn new(layout: &'a Layout) -> Self {
        Receiving { layout, pieces: Vec::new(), current: None }
    }

    /// Takes the next chunk of the stream: payload, or a piece's 4-byte CRC once its bytes are in.
    fn take(&mut self, chunk: &[u8]) -> Result<()> {
        let index = self.pieces.len();
        let piece = self.layout.pieces.get(index).context("more data than the layout has")?;
        let (buffer, filled, crc) =
            self.current.get_or_insert_with(|| (HostBuffer::zeroed(piece.bytes).expect("memory"), 0, 0));
        if *filled == piece.bytes {
            let sent = u32::from_le_bytes(chunk.try_into().context("a 4-byte CRC")?);
            if sent != *crc {
                bail!("piece {index} arrived corrupt");
            }
            let (buffer, _, _) = self.current.take().expect("present");
            self.pieces.push(buffer);
            return Ok(());
        }
        buffer[*filled..*filled + chunk.len()].copy_from_slice(chunk);
        *crc = crc32c::crc32c_append(*crc, chunk);
        *filled += chunk.len();
        Ok(())
    }

    fn place(self, to: &Slice, specs: &[TensorSpec]) -> Result<()> {
        if self.pieces.len() != self.layout.pieces.len() {
            bail!("{} of {} pieces arrived", self.pieces.len(), self.layout.pieces.len());
        }
        let mut pieces = self.pieces.into_iter();
        let arrays: Vec<_> = specs
            .iter()
            .map(|spec| to.upload_each(spec, |_, _| Ok(pieces.next().expect("counted above"))))
            .collect::<Result<_, _>>()?;
        drop(arrays);
        Ok(())
    }
}

/// The chunks a sender puts on the wire: each piece's bytes in segments, then its CRC.
fn chunks<'a>(views: &'a [&'a [u8]]) -> impl Iterator<Item = Bytes> + 'a {
    views.iter().flat_map(|view| {
        let crc = crc32c::crc32c(view);
        view.chunks(SEGMENT)
            .map(Bytes::copy_from_slice)
            .chain(std::iter::once(Bytes::copy_from_slice(&crc.to_le_bytes())))
    })
}

fn via_codec(layout: &Layout, views: &[&[u8]], to: &Slice, specs: &[TensorSpec]) -> Result<f64> {
    use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
    let codec = || LengthDelimitedCodec::builder().max_frame_length(2 * SEGMENT).new_codec();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build();
    std::thread::scope(|scope| {
        let sender = scope.spawn(|| -> Result<()> {
            runtime()?.block_on(async {
                let (stream, _) = tokio::net::TcpListener::from_std({
                    listener.set_nonblocking(true)?;
                    listener
                })?
                .accept()
                .await?;
                stream.set_nodelay(true)?;
                let mut framed = FramedWrite::new(stream, codec());
                for chunk in chunks(views) {
                    framed.feed(chunk).await?;
                }
                SinkExt::<Bytes>::flush(&mut framed).await?;
                Ok(())
            })
        });
        let started = Instant::now();
        let mut receiving = Receiving::new(layout);
        runtime()?.block_on(async {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let mut framed = FramedRead::new(stream, codec());
            while let Some(frame) = framed.next().await {
                receiving.take(&frame?)?;
            }
            anyhow::Ok(())
        })?;
        receiving.place(to, specs)?;
        let seconds = started.elapsed().as_secs_f64();
        sender.join().expect("sender")?;
        Ok(seconds)
    })
}

/// A tonic codec of raw bytes: what a gRPC transfer of the state would send, minus protobuf.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

const TONIC_PATH: &str = "/podctl.bench.State/Pull";

/// The server side: every message the sender thread hands over, in order.
#[derive(Clone)]
struct PullService(std::sync::Arc<std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Bytes>>>>);

impl tonic::server::NamedService for PullService {
    const NAME: &'static str = "podctl.bench.State";
}

impl tonic::server::ServerStreamingService<Bytes> for PullService {
    type Response = Bytes;
    type ResponseStream = futures::stream::BoxStream<'static, Result<Bytes, tonic::Status>>;
    type Future = futures::future::Ready<Result<tonic::Response<Self::ResponseStream>, tonic::Status>>;
    fn call(&mut self, _: tonic::Request<Bytes>) -> Self::Future {
        let rx = self.0.lock().expect("lock").take();
        futures::future::ready(match rx {
            Some(rx) => Ok(tonic::Response::new(
                futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) })
                    .boxed(),
            )),
            None => Err(tonic::Status::failed_precondition("pulled once already")),
        })
    }
}

impl<B> tower::Service<http::Request<B>> for PullService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.server_streaming(service, request).await)
        })
    }
}

fn via_tonic(layout: &Layout, views: &[&[u8]], to: &Slice, specs: &[TensorSpec]) -> Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let service = PullService(std::sync::Arc::new(std::sync::Mutex::new(Some(rx))));
    let window = 16 << 20;
    let server = tonic::transport::Server::builder()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .add_service(service)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = runtime.spawn(server);
    let seconds = std::thread::scope(|scope| {
        // The device memory is borrowed, so a thread copies it into owned messages (as a real
        // server would), a few ahead of the wire.
        scope.spawn(move || {
            for chunk in chunks(views) {
                if tx.blocking_send(chunk).is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let mut receiving = Receiving::new(layout);
        runtime.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
                .initial_stream_window_size(window)
                .initial_connection_window_size(window)
                .connect()
                .await?;
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await?;
            let path = http::uri::PathAndQuery::from_static(TONIC_PATH);
            let mut stream =
                grpc.server_streaming(tonic::Request::new(Bytes::new()), path, RawCodec).await?.into_inner();
            while let Some(message) = stream.message().await? {
                receiving.take(&message)?;
            }
            anyhow::Ok(())
        })?;
        receiving.place(to, specs)?;
        anyhow::Ok(started.elapsed().as_secs_f64())
    })?;
    server.abort();
    Ok(seconds)
}

// ---------------------------------------------------------------- part 2: a job

/// Qwen3-0.6B's widths with as many layers as make parameters and AdamW moments (float32)
/// about `gb` GB.
fn job_model(gb: f64) -> Result<bundle::ModelConfig> {
    let mut model = bundle::preset("qwen3-0.6b").map_err(anyhow::Error::msg)?;
    let per_layer = {
        let mut one = model.clone();
        one.num_layers = 1;
        let base = one.num_params();
        one.num_layers = 2;
        one.num_params() - base
    };
    let mut none = model.clone();
    none.num_layers = 1;
    let rest = none.num_params() - per_layer;
    model.num_layers = ((gb * GB / 12.0 - rest as f64) / per_layer as f64).round().max(1.0) as u64;
    model.preset = "hf:heal-bench".into();
    Ok(model)
}

/// A Hugging Face directory of `model` with random bfloat16 weights (small, like a trained
/// model's), so the job starts the way a fine-tune of a downloaded model does.
fn write_model(dir: &Path, model: &bundle::ModelConfig) -> Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let config = hf::config::synthesize(model, DType::Bfloat16);
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    let tensors: Vec<(String, safetensors::Dtype, Vec<u64>)> = hf::names::hf_tensors(model)
        .into_iter()
        .map(|t| (t.name, safetensors::Dtype::BF16, t.shape))
        .collect();
    let header = hf::header::write_header(&tensors)?;
    let mut file =
        std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(dir.join("model.safetensors"))?);
    file.write_all(&header)?;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut block = vec![0u8; 8 << 20];
    for (_, _, shape) in &tensors {
        let mut left = shape.iter().product::<u64>() * 2;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            for pair in block[..n].chunks_mut(2) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Uniform in about +-0.03: a bf16 with exponent 2^-6 or 2^-7 and a random sign.
                let bits: u16 = 0x3C00 | ((x as u16) & 0x80FF);
                pair.copy_from_slice(&bits.to_le_bytes());
            }
            file.write_all(&block[..n])?;
            left -= n as u64;
        }
    }
    file.flush()?;
    Ok(())
}

fn kill(pid: u32) {
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
}

fn pid_of(run: &Path, slice: u32) -> Option<u32> {
    std::fs::read_to_string(run.join(format!("workers/slice-{slice}.pid"))).ok()?.trim().parse().ok()
}

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn committed_steps(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
}

/// Waits up to `limit` for `ready`, failing with `what`; stops early if `launch` exited.
fn wait_for<T>(
    what: &str,
    limit: Duration,
    launch: &mut Child,
    mut ready: impl FnMut() -> Option<T>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = ready() {
            return Ok(value);
        }
        if let Some(status) = launch.try_wait()? {
            bail!("podctl launch exited ({status}) while waiting for {what}");
        }
        if started.elapsed() > limit {
            bail!("no {what} after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn job(home: &Path, gb: f64) -> Result<()> {
    let model = job_model(gb)?;
    let state = model.num_params() * 12;
    let free = std::fs::read_to_string("/proc/meminfo")?
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    println!(
        "part 2, a job: 2 slices of a Qwen3-shaped model ({} layers, {:.0}M parameters), state {:.2} GB; {:.1} GB of memory available",
        model.num_layers,
        model.num_params() as f64 / 1e6,
        state as f64 / GB,
        free as f64 / GB
    );
    if (free as f64) < 3.5 * state as f64 {
        bail!(
            "part 2 needs about {:.1} GB of free memory for this state; pass a smaller --job-gb or --skip-job",
            3.5 * state as f64 / GB
        );
    }
    let scratch = tempfile::Builder::new().prefix("podctl-heal-bench").tempdir()?;
    let dir = scratch.path();
    write_model(&dir.join("model"), &model)?;
    let run = dir.join("heal");
    let spec = dir.join("heal.yaml");
    std::fs::write(
        &spec,
        format!(
            "name: heal\nmodel: {{ hf: {} }}\nmesh: {{ dcn: 2, ici: {{ fsdp: 1, tp: 1 }} }}\n\
             batch: {{ global: 2, micro: 1 }}\nseq_len: 128\nsteps: 100000\nseed: 1\n\
             data: {{ kind: arithmetic }}\noutput: {}\n",
            dir.join("model").display(),
            run.display()
        ),
    )?;
    let bin = podctl_chaos::build_binaries(home, true)?;
    let log = std::fs::File::create(dir.join("launch.log"))?;
    let mut launch = Command::new(bin.join("podctl"))
        .arg("launch")
        .arg(&spec)
        .env("PODCTL_HOME", home)
        .env("PODCTL_CACHE", home.join(".cache/podctl"))
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()?;
    let outcome = (|| -> Result<()> {
        wait_for("3 committed steps", Duration::from_secs(1800), &mut launch, || {
            (committed_steps(&run) >= 3).then_some(())
        })?;
        let limit = tcp(state)?;
        let victim = pid_of(&run, 1).context("slice 1's pid")?;
        kill(victim);
        let killed = Instant::now();
        let log = run.join("workers/slice-1.log");
        let line = wait_for("the replacement's catch-up", Duration::from_secs(1800), &mut launch, || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines().rev().find(|l| l.contains("caught up from peer")).map(str::to_string)
        })?;
        let served = std::fs::read_to_string(run.join("workers/slice-0.log"))
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| l.contains("served the state"))
            .map(str::to_string)
            .unwrap_or_default();
        // The replacement's whole peak resident memory (programs, runtime and the pulled state).
        let peak = pid_of(&run, 1).and_then(|pid| status_kib(pid, "VmHWM:")).map_or_else(
            || "unknown".to_string(),
            |kib| {
                format!(
                    "{:.2} GB ({:.2}x the state)",
                    kib as f64 * 1024.0 / GB,
                    kib as f64 * 1024.0 / state as f64
                )
            },
        );
        let limit_rate = state as f64 / GB / limit;
        println!(
            "loopback TCP limit right before the kill: {limit_rate:.2} GB/s ({:.2} GB in {limit:.2}s)",
            state as f64 / GB
        );
        println!("replacement: {}", line.split("caught up").nth(1).map_or(line.as_str(), |l| l.trim()));
        println!("replacement's peak resident memory: {peak}");
        println!("survivor:    {}", served.split("served").nth(1).map_or(served.as_str(), |l| l.trim()));
        let rate = line
            .split('(')
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|r| r.parse::<f64>().ok())
            .context("a rate in the catch-up line")?;
        println!(
            "heal: {rate:.2} GB/s = {:.0}% of the loopback TCP limit; SIGKILL to caught up {:.1}s (the replacement starts, loads its programs, registers)",
            100.0 * rate / limit_rate,
            killed.elapsed().as_secs_f64()
        );
        Ok(())
    })();
    let _ = launch.kill();
    let _ = launch.wait();
    for slice in 0..2 {
        if let Some(pid) = pid_of(&run, slice) {
            kill(pid);
        }
    }
    // The scratch directory goes with this function: say why the job failed before it does.
    outcome.with_context(|| {
        let log = std::fs::read_to_string(dir.join("launch.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        format!("the job's launch.log ends:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    })
}
