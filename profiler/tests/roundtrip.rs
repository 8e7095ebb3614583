//! Every record kind survives encoding and decoding, through the synchronous writer and through
//! the live recorder (GPU operations, devices, memory samples).

mod common;

use std::sync::Arc;

use perfkit_profiler::model::*;
use perfkit_profiler::recorder::{GpuOp, KernelLaunch};
use perfkit_profiler::{Builder, TraceReader, TraceStatus, TraceWriter};
use tracing_subscriber::layer::SubscriberExt;

fn sample_records() -> Vec<Record> {
    let step = Arc::new(Callsite {
        name: "step".into(),
        target: "train".into(),
        file: Some("src/train.rs".into()),
        line: Some(42),
        level: Level::Info,
        kind: CallsiteKind::Span,
        fields: vec![Arc::<str>::from("step"), Arc::<str>::from("lr")].into(),
    });
    let event = Arc::new(Callsite {
        name: "event src/train.rs:50".into(),
        target: "train".into(),
        file: None,
        line: None,
        level: Level::Warn,
        kind: CallsiteKind::Event,
        fields: vec![Arc::<str>::from("message")].into(),
    });
    let loc = SourceLocation {
        file: "src/train.rs".into(),
        line: 77,
        column: 9,
    };
    let field = |cs: &Callsite, index: u32, value: FieldValue| Field {
        index,
        name: cs.fields[index as usize].clone(),
        value,
    };
    let mut gpu = Vec::new();
    for (i, kind) in GpuOpKind::ALL.into_iter().enumerate() {
        let i = i as u64;
        gpu.push(Record::Gpu(GpuEvent {
            thread: 1,
            kind,
            id: 100 + i,
            device: (i % 2) as u32,
            stream: (!i.is_multiple_of(3)).then_some(0x7f00_1234_5678 + i),
            bytes: 1 << (10 + i),
            host_memory: match i % 3 {
                0 => None,
                1 => Some(HostMemory::Pinned),
                _ => Some(HostMemory::Pageable),
            },
            host_start: 5_000 + i * 1_000,
            host_end: 5_500 + i * 1_000,
            gpu_start: i.is_multiple_of(2).then_some(5_200 + i * 1_000),
            gpu_end: i.is_multiple_of(4).then_some(9_000 + i * 1_000),
            gpu_end_at_host_return: i == 4,
            span: (i != 3).then_some(SpanId(1)),
            location: (i != 5).then(|| loc.clone()),
            kernel: (kind == GpuOpKind::Kernel).then(|| KernelInfo {
                name: "sgemm_128x64".into(),
                grid: [64, 2, 1],
                block: [256, 1, 1],
                shared_mem_bytes: 49152,
            }),
        }));
    }
    let mut v = vec![
        Record::Thread(ThreadInfo::new(0, 4242, Some("main"))),
        Record::Thread(ThreadInfo::new(1, 4243, None)),
        Record::SpanNew(SpanNew {
            thread: 0,
            ts: 1_000,
            id: SpanId(1),
            parent: None,
            callsite: step.clone(),
            fields: vec![
                field(&step, 0, FieldValue::U64(12)),
                field(&step, 1, FieldValue::F64(-0.25)),
            ],
        }),
        Record::SpanEnter(SpanEdge {
            thread: 0,
            ts: 1_010,
            span: SpanId(1),
        }),
        Record::SpanNew(SpanNew {
            thread: 1,
            ts: 900,
            id: SpanId(1025),
            parent: Some(SpanId(1)),
            callsite: step.clone(),
            fields: vec![
                field(&step, 0, FieldValue::I64(-7)),
                field(&step, 1, FieldValue::Str("héllo \"quoted\" <b>".into())),
            ],
        }),
        Record::SpanRecord(SpanRecord {
            thread: 0,
            ts: 1_500,
            span: SpanId(1),
            callsite: step.clone(),
            fields: vec![field(&step, 1, FieldValue::Bool(true))],
        }),
        Record::Event(Event {
            thread: 0,
            ts: 1_600,
            span: Some(SpanId(1)),
            callsite: event.clone(),
            fields: vec![field(&event, 0, FieldValue::Str("loss went up".into()))],
        }),
        Record::Event(Event {
            thread: 1,
            ts: 1_700,
            span: None,
            callsite: event,
            fields: vec![],
        }),
        Record::Device(DeviceInfo::new(
            0,
            "NVIDIA H100 80GB HBM3",
            85_000_000_000,
            (9, 0),
        )),
        Record::DeviceMemory(DeviceMemory {
            ts: 2_000,
            device: 0,
            used: 1 << 30,
            total: 85_000_000_000,
        }),
        Record::GpuTiming(GpuTiming {
            id: 101,
            gpu_start: 6_100,
            gpu_end: 6_900,
        }),
        Record::GpuSample(GpuSample {
            ts: 2_100,
            device: 1,
            gpu_util_pct: Some(87),
            mem_util_pct: Some(0),
            memory_used: Some(3 << 30),
            memory_total: None,
            sm_clock_mhz: Some(1980),
            power_mw: None,
        }),
        Record::Module(ModuleInfo {
            path: "/usr/lib/libcudart.so.13".into(),
            base: 0x7f00_0000_0000,
            size: 0x40_0000,
        }),
        Record::Stack(StackInfo {
            id: 1,
            ips: vec![0x5555_0000_1234, 0x5555_0000_1000, 0x7f00_0000_0010, 0],
        }),
        Record::OpStack(OpStack { op: 104, stack: 1 }),
    ];
    v.extend(gpu);
    v.extend([
        Record::SpanExit(SpanEdge {
            thread: 0,
            ts: 20_000,
            span: SpanId(1),
        }),
        Record::SpanClose(SpanEdge {
            thread: 1,
            ts: 20_010,
            span: SpanId(1),
        }),
        Record::Dropped(Dropped {
            thread: Some(1),
            ts: 20_100,
            count: 17,
        }),
        Record::Dropped(Dropped {
            thread: None,
            ts: 20_200,
            count: 3,
        }),
        Record::Panic(PanicInfo {
            thread: Some(0),
            ts: 20_300,
            message: "index out of bounds".into(),
            location: Some(loc),
        }),
        Record::Panic(PanicInfo {
            thread: None,
            ts: 20_400,
            message: String::new(),
            location: None,
        }),
        Record::End(TraceEnd {
            ts: 21_000,
            end_unix_ns: 1_700_000_000_000_000_000,
            reason: EndReason::Panic,
            records: 30,
            dropped: 20,
        }),
    ]);
    v
}

#[test]
fn every_record_kind_round_trips_through_the_writer() {
    let mut header = Header::new("train", 777);
    header.host = "node-3".into();
    header.command_line = vec!["train".into(), "--steps".into(), "5".into()];
    header.start_unix_ns = 1_700_000_000_000_000_000;
    header.rank = Some(3);
    header.local_rank = Some(1);
    header.world_size = Some(8);
    header.extra = vec![("cuda".into(), "13.0".into())];
    let records = sample_records();
    // Small chunks, so that records and their definitions are spread over many chunks.
    for chunk in [1usize, 64, 1 << 16] {
        let mut w = TraceWriter::new(Vec::new(), &header)
            .unwrap()
            .chunk_size(chunk);
        for r in &records {
            w.write(r).unwrap();
        }
        let bytes = w.finish().unwrap();
        let mut r = TraceReader::from_reader(&bytes[..], "mem.pktrace").unwrap();
        assert_eq!(r.header(), &header);
        let back: Vec<Record> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(back, records, "chunk size {chunk}");
        assert!(matches!(r.status(), TraceStatus::Complete(e) if e.dropped == 20));
    }
}

#[test]
fn gpu_operations_round_trip_through_the_recorder() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) = common::record_local(Builder::new().output(dir.path()));
    let rec = guard.recorder().expect("recording");
    let kernel_name = rec.intern("relu_forward");
    let location = std::panic::Location::caller();
    let mut sent = Vec::new();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        let _step = tracing::info_span!("step", step = 0u64).entered();
        let span = rec.current_span().expect("inside a span");
        rec.device(&DeviceInfo::new(0, "Test GPU", 1 << 34, (9, 0)));
        for kind in GpuOpKind::ALL {
            let t0 = rec.now();
            let id = rec.next_id();
            let op = GpuOp {
                id,
                device: 0,
                stream: Some(0xdead_beef),
                bytes: if kind == GpuOpKind::Kernel { 0 } else { 4096 },
                host_memory: kind.is_copy().then_some(HostMemory::Pinned),
                host_start: t0,
                host_end: t0 + 1_000,
                gpu_start: Some(t0 + 200),
                gpu_end: Some(t0 + 900),
                gpu_end_at_host_return: kind == GpuOpKind::MemcpyDtoH,
                span: Some(span),
                location: Some(location),
                kernel: (kind == GpuOpKind::Kernel).then_some(KernelLaunch {
                    name: kernel_name,
                    grid: [10, 1, 1],
                    block: [128, 2, 1],
                    shared_mem_bytes: 1024,
                }),
                ..GpuOp::new(kind)
            };
            assert!(rec.gpu(&op));
            sent.push((op, span));
        }
        // An operation recorded before its timing is known, then resolved.
        let late = rec.next_id();
        let t = rec.now();
        assert!(rec.gpu(&GpuOp {
            id: late,
            host_start: t,
            host_end: t + 10,
            ..GpuOp::new(GpuOpKind::Kernel)
        }));
        assert!(rec.gpu_timing(late, t + 50, t + 80));
        assert!(rec.device_memory(0, 123_456, 1 << 34));
        let stack = rec.stack(&[0x1000, 0x2000]);
        assert_eq!(
            rec.stack(&[0x1000, 0x2000]),
            stack,
            "a stack is recorded once"
        );
        assert_ne!(rec.stack(&[0x1000]), stack);
        rec.op_stack(late, stack);
        rec.module(&ModuleInfo {
            path: "train".into(),
            base: 0x1000,
            size: 0x9000,
        });
        rec.gpu_sample(&GpuSample {
            ts: rec.now(),
            device: 0,
            gpu_util_pct: Some(50),
            mem_util_pct: None,
            memory_used: Some(1),
            memory_total: Some(2),
            sm_clock_mhz: None,
            power_mw: Some(70_000),
        });
    });
    drop(guard);
    let (_, records, status) = common::read_all(&path);
    assert!(status.is_complete());
    let gpu: Vec<&GpuEvent> = records
        .iter()
        .filter_map(|r| match r {
            Record::Gpu(g) => Some(g),
            _ => None,
        })
        .collect();
    assert_eq!(gpu.len(), sent.len() + 1);
    for (g, (op, span)) in gpu.iter().zip(&sent) {
        assert_eq!(g.kind, op.kind);
        assert_eq!(g.id, op.id);
        assert_eq!(g.stream, op.stream);
        assert_eq!(g.bytes, op.bytes);
        assert_eq!(g.host_memory, op.host_memory);
        assert_eq!((g.host_start, g.host_end), (op.host_start, op.host_end));
        assert_eq!((g.gpu_start, g.gpu_end), (op.gpu_start, op.gpu_end));
        assert_eq!(g.gpu_end_at_host_return, op.gpu_end_at_host_return);
        assert_eq!(g.span, Some(*span));
        let loc = g.location.as_ref().expect("location");
        assert_eq!(
            (&*loc.file, loc.line, loc.column),
            (location.file(), location.line(), location.column())
        );
        if op.kind == GpuOpKind::Kernel {
            let k = g.kernel.as_ref().expect("kernel info");
            assert_eq!(&*k.name, "relu_forward");
            assert_eq!(
                (k.grid, k.block, k.shared_mem_bytes),
                ([10, 1, 1], [128, 2, 1], 1024)
            );
        } else {
            assert!(g.kernel.is_none());
        }
    }
    let late = gpu.last().unwrap();
    assert_eq!(
        (late.gpu_start, late.gpu_end, late.span, late.stream),
        (None, None, None, None)
    );
    assert!(records.iter().any(
        |r| matches!(r, Record::GpuTiming(t) if t.id == late.id && t.gpu_end - t.gpu_start == 30)
    ));
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::Device(d) if d.name == "Test GPU"))
    );
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::DeviceMemory(m) if m.used == 123_456))
    );
    let stacks: Vec<&StackInfo> = records
        .iter()
        .filter_map(|r| match r {
            Record::Stack(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(stacks.len(), 2);
    assert_eq!(stacks[0].ips, [0x1000, 0x2000]);
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::OpStack(o) if o.op == late.id && o.stack == stacks[0].id))
    );
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::Module(m) if m.path == "train" && m.size == 0x9000))
    );
    assert!(records.iter().any(|r| matches!(r, Record::GpuSample(g) if g.power_mw == Some(70_000) && g.mem_util_pct.is_none())));
    // Every GPU event's thread was announced first.
    let announced: Vec<u32> = records
        .iter()
        .filter_map(|r| match r {
            Record::Thread(t) => Some(t.index),
            _ => None,
        })
        .collect();
    assert!(gpu.iter().all(|g| announced.contains(&g.thread)));
}
