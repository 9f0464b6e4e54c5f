//! The server's half of a step: its proxy counting the client's immediates, and the echo
//! that answers them.

use super::*;
use crate::workload::delivery::make_visible;

/// The server's host path: answer every WRITE+imm (latency) or the last one (bandwidth), each
/// answer after the bytes it answers are visible. It answers the host steps, and the proxy
/// steps unless `echo_ring`.
pub(super) fn server_host<T: Transport>(
    e: &mut End<'_, T>,
    src: &T::Mr,
    step: &GpuStep,
) -> Result<u64> {
    let (size, half) = (step.size as usize, step.half as usize);
    let lat = matches!(step.kind, GpuStepKind::HostLat | GpuStepKind::ProxyLat);
    let mut buf = vec![Completion::default(); 64];
    let (mut done, mut imms) = (0u64, 0u64);
    let mut w = Watch::new(e.idle);
    let live = e.live.clone();
    let (expect, answers) = if lat {
        (step.warm + step.n, step.warm + step.n)
    } else {
        (step.n, 1)
    };
    let len = if lat { size } else { ANSWER };
    let op = write_op(e, src, half as u64, half as u64, len, 0)?;
    let mut sent = 0u64;
    let waiting_for = format!("the client's WRITEs ({})", step_name(step.kind));
    while sent < answers || done < answers {
        let before = imms;
        let k = poll_once(e.ep, &mut buf, &mut done, &mut imms, "server")?;
        if imms > expect {
            return Err(Error::Protocol(format!(
                "gpu-write: {imms} immediates where the client sends {expect}"
            )));
        }
        let due = if lat { imms } else { u64::from(imms == expect) };
        // What arrived is visible here before the answer says so (on GPU memory a NIC wrote:
        // the device's flush), as the ring path's proxy lands before it counts an arrival.
        if sent < due {
            make_visible(e.ep, &[src])?;
        }
        while sent < due {
            let mut o = op;
            o.imm = Some(immediate(0, sent as u16));
            post_one(e.ep, &o, &mut buf, &mut done, &mut imms, "server")?;
            sent += 1;
        }
        if k > 0 || imms != before {
            w.reset();
        }
        w.check(&live, &waiting_for)?;
    }
    Ok(imms)
}

/// The server's ring path (`echo_ring`): its echo (this thread) answers each arrival
/// (latency) or the last (bandwidth) through its ring.
pub(super) fn server_proxy<T: Transport>(
    e: &mut End<'_, T>,
    region: T::Mr,
    step: &GpuStep,
) -> Result<(u64, T::Mr)> {
    let (size, half) = (step.size as usize, step.half as usize);
    let lat = step.kind == GpuStepKind::ProxyLat;
    let mem = RingMemory::new(RingLayout::new(step.capacity, 1).map_err(ring_err)?);
    let ring = mem.ring();
    let idle = e.idle;
    let (expect, answers) = if lat {
        (step.warm + step.n, step.warm + step.n)
    } else {
        (step.n, 1)
    };
    let len = if lat { size } else { ANSWER };
    // Its answers are one command at a time: the batch does not matter here.
    let (got, region, _) = with_proxy(e, ring, region, transport_proxy::DEFAULT_BATCH, || {
        let arrivals = ring.arrivals(0).expect("slot 0");
        for k in 0..answers {
            let target = if lat { k + 1 } else { expect };
            spin_until(&ring, arrivals, target, idle, "the client's proxied WRITEs")?;
            let h = half as u64;
            let c = Command::write(
                0,
                pack(0, h),
                pack(0, h),
                len as u32,
                Some(immediate(0, k as u16)),
            );
            ring.push(&c).map_err(ring_err)?;
        }
        ring.wait_done(answers, idle).map_err(ring_err)?;
        let got = arrivals.load(Ordering::Acquire);
        if got != expect {
            return Err(Error::Protocol(format!(
                "gpu-write: {got} immediates where the client sends {expect}"
            )));
        }
        Ok(got)
    })?;
    Ok((got, region))
}

/// The server's part of one step: clear the landing range, fill the answers' source, tell the
/// client it is ready (`ready`), answer, then compare every landed byte with the client's
/// pattern. Returns what to report and the region back.
pub fn serve_step<T: Transport>(
    e: &mut End<'_, T>,
    mut region: T::Mr,
    step: &GpuStep,
    ready: impl FnOnce() -> Result<()>,
) -> Result<(GpuStepDone, T::Mr)> {
    let (size, half) = (step.size as usize, step.half as usize);
    check_halves(region.len(), e.remote.len as usize, half, size)?;
    let (at, len) = landing(step, true);
    if step.verify {
        zero(&mut region, at, len)?;
    }
    let mut src = vec![0u8; size.max(ANSWER)];
    fill_at(step.seed, SERVER_SIDE, half as u64, &mut src);
    region
        .memory_mut()
        .write_at(half, &src)
        .ctx(|| "filling the answers' source")?;
    ready()?;
    let by_ring = answered_by_ring(step);
    let (arrivals, region) = if by_ring {
        server_proxy(e, region, step)?
    } else {
        let core = e.core;
        let e2 = &mut *e;
        let (r, region) = std::thread::scope(|s| {
            on_core(s, core, move || (server_host(e2, &region, step), region)).join()
        })
        .map_err(|_| Error::Protocol("the host path's thread panicked".into()))?;
        (r?, region)
    };
    let what = step_name(step.kind);
    let checked = if step.verify {
        verify(&region, step.seed, 0, at, len, size, what)?
    } else {
        0
    };
    Ok((
        GpuStepDone {
            id: step.id,
            arrivals,
            checked,
            core: e.core.map(|c| c as u32),
            by_ring,
        },
        region,
    ))
}
