//! `--workload gpu-write`: its flags as a configuration, the producer, the run and its output.

use super::*;

/// `loopback --workload gpu-write`: the flags as its config; the CPU producer.
fn gpu_write_cfg(w: &crate::cli::WorkloadArgs, c: &crate::cli::Common) -> Result<GpuWriteCfg> {
    let verbose = c.verbose;
    // The proxy's and the producer's batches are allocated up front: bounded like every
    // workload's (gpu-write does not go through `Plan`).
    bench_core::plan::allowed("--batch", w.batch, 1, bench_core::proto::MAX_BATCH)?;
    let mut cfg = GpuWriteCfg {
        verbose: verbose > 0,
        verify: !w.no_verify,
        seed: w.seed,
        batch: w.batch as usize,
        pin: w.pin,
        echo_ring: w.server_echo == "ring",
        ..GpuWriteCfg::default()
    };
    cfg.idle = idle_or(c, cfg.idle)?;
    if let Some(warm) = w.warmup {
        cfg.lat_warm = u64::from(warm);
    }
    let sizes: Vec<usize> = w
        .sizes
        .iter()
        .copied()
        .chain(w.size)
        .map(|s| s.0 as usize)
        .collect();
    if sizes.iter().any(|&s| s == 0 || s > u32::MAX as usize) {
        return Err(Error::Usage(
            "--size/--sizes: gpu-write sizes are 1 byte to 4 GiB - 1".into(),
        ));
    }
    if !sizes.is_empty() {
        cfg.lat_sizes = sizes.iter().copied().filter(|&s| s <= 64 << 10).collect();
        cfg.bw_sizes = sizes;
    }
    // -n N: N latency round trips per size, N x 256 KiB per bandwidth size, N x 2000 commands
    // through the ring alone (the default 1000: 250 MiB a size, 2 M commands).
    if let Some(n) = w.iters {
        if !(1..=1 << 20).contains(&n) {
            return Err(Error::Usage(format!(
                "-n {n}: gpu-write takes 1..={} (round trips per latency size; x 256 KiB per \
                 bandwidth size)",
                1u64 << 20
            )));
        }
        cfg.lat_iters = n;
        cfg.bw_bytes = n << 18;
        cfg.ring_cmds = n * 2000;
    }
    if let Some(r) = w.rounds {
        if r == 0 || r > bench_core::plan::MAX_ROUNDS {
            return Err(Error::Usage(format!(
                "--rounds {r}: allowed 1..={}",
                bench_core::plan::MAX_ROUNDS
            )));
        }
        cfg.rounds = r;
    }
    if w.ladder || w.single_buffer || w.pages.is_some() || w.window != 0 {
        return Err(Error::Usage(
            "gpu-write takes --size/--sizes, -n (latency round trips), --warmup (untimed round \
             trips), --rounds, --batch, --seed, --pin and --no-verify; not --ladder, \
             --single-buffer, --pages or --window"
                .into(),
        ));
    }
    Ok(cfg)
}

/// `--producer`: a host thread, or GPU threads on the side's first GPU (a usage error naming
/// what is missing where this build or machine has no CUDA).
fn gpu_write_producer(w: &crate::cli::WorkloadArgs, side: &SideCfg) -> Result<Box<dyn Producer>> {
    let _gpu = side.gpus.first().copied().unwrap_or(0);
    if (w.kernel_poll_sleep != 0 || w.kernel_poll_margin != 0 || w.kernel_publish != "unfenced")
        && w.producer != "cuda"
    {
        return Err(Error::Usage(
            "--kernel-poll-sleep, --kernel-poll-margin, --kernel-publish: only the cuda \
             producer's kernel polls"
                .into(),
        ));
    }
    match w.producer.as_str() {
        "cpu" => Ok(Box::new(CpuProducer)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Box::new(
            bench_core::workload::gpu_write_cuda::CudaProducer::new(
                _gpu,
                bench_core::workload::gpu_write_cuda::KernelWait {
                    poll_sleep_ns: w.kernel_poll_sleep,
                    poll_margin_ns: w.kernel_poll_margin,
                    publish: match w.kernel_publish.as_str() {
                        "release" => bench_core::workload::gpu_write_cuda::KernelPublish::Release,
                        "fence" => bench_core::workload::gpu_write_cuda::KernelPublish::Fence,
                        _ => bench_core::workload::gpu_write_cuda::KernelPublish::Unfenced,
                    },
                },
            )?,
        )),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(Error::Usage(
            "--producer cuda: this rdma-bench was built without the cuda feature".into(),
        )),
        other => Err(Error::Usage(format!("--producer {other}: cpu or cuda"))),
    }
}

pub(super) fn gpu_write(a: &LoopbackArgs) -> Result<()> {
    let cfg = gpu_write_cfg(&a.work, &a.common)?;
    let (client, server) =
        loopback_cfgs(&a.common, default_provider(&a.common), a.work.buf_offset)?;
    let producer = gpu_write_producer(&a.work, &client)?;
    let out = a
        .common
        .backend
        .gpu_write(&client, &server, &cfg, producer.as_ref())?;
    print_gpu_write(&out, a.common.json)
}

/// `client --workload gpu-write`: the producer and its proxy here, the server's proxy and
/// echo there.
pub(super) fn gpu_write_client(a: &ClientArgs) -> Result<()> {
    let cfg = gpu_write_cfg(&a.work, &a.common)?;
    let side = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
        a.work.buf_offset,
    )?;
    a.common.backend.check_built()?;
    let producer = gpu_write_producer(&a.work, &side)?;
    let stream = session::connect(&a.connect, Duration::from_secs_f64(a.connect_timeout))?;
    let out = a
        .common
        .backend
        .gpu_write_client(&side, stream, &cfg, producer.as_ref())?;
    print_gpu_write(&out, a.common.json)
}

fn print_gpu_write(
    out: &bench_core::workload::gpu_write::GpuWriteReport,
    json: bool,
) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string(&out).map_err(|e| Error::Protocol(e.to_string()))?
        );
    } else {
        print!("{}", out.render());
    }
    Ok(())
}
