//! The trait: registration and keys, peers, posting and polling.

use super::*;

impl Transport for Endpoint {
    type Mr = UcxMr;
    type RemoteKey = UcxKey;
    const INFO: &'static BackendInfo = &crate::INFO;

    fn open(nic: &NicDesc) -> Result<Self> {
        Self::open_ucx(nic)
    }

    fn provider(&self) -> &str {
        &self.tls
    }

    fn nic_name(&self) -> &str {
        &self.devices
    }

    fn address(&self) -> EndpointAddr {
        EndpointAddr(self.address.clone())
    }

    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        let worker_addr = frame::unwrap(Kind::Address, &addr.0, "worker address")?;
        // Its WRITEs' landings and immediates queue apart from other initiators'.
        let origin = frame::origin(worker_addr);
        let peer = Box::new(Peer {
            ep: ptr::null_mut(),
            failed: Cell::new(sys::UCS_OK),
            puts: Cell::new(0),
            flushed: Cell::new(0),
            am_writes: [self.write == Write::Am; 4],
        });
        let params = sys::ucp_ep_params_t {
            field_mask: u64::from(
                sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            ),
            address: worker_addr.as_ptr() as *const sys::ucp_address_t,
            err_mode: if self.peer_errors {
                sys::UCP_ERR_HANDLING_MODE_PEER
            } else {
                sys::UCP_ERR_HANDLING_MODE_NONE
            },
            err_handler: sys::ucp_err_handler_t {
                cb: Some(on_peer_error),
                arg: &*peer as *const Peer as *mut c_void,
            },
            ..Default::default()
        };
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the worker is live; the address bytes passed the frame check (length and
        // hash of what a peer's ucp_worker_get_address gave) and outlive the call; the error
        // handler's arg is the boxed Peer, kept (boxed, never moved) until its ep is closed.
        let st = unsafe { sys::ucp_ep_create(self.worker, &params, &mut ep) };
        let hint =
            crate::ep_create_hint(&self.tls, st == sys::UCS_ERR_UNREACHABLE, self.peer_errors);
        check("ucp_ep_create", st, hint)?;
        let mut peer = peer;
        peer.ep = ep;
        if self.write == Write::Auto {
            // SAFETY: ep was just created on this worker; f is an open stream.
            let lanes = crate::printed(|f| unsafe { sys::ucp_ep_print_info(ep, f.cast()) });
            peer.am_writes = crate::puts_emulated(&lanes);
        }
        self.peers.push(peer);
        self.shared.landings.borrow_mut().add(origin);
        Ok(PeerId(self.peers.len() as u32 - 1))
    }

    fn register(&mut self, mem: Memory) -> Result<UcxMr> {
        self.map_region(mem)
    }

    /// The memory comes back at once, where no operation of this endpoint is in flight (a
    /// receive posted, a send, put or immediate unfinished, a WRITE still landing); else an
    /// error, and the region is dropped (below). Over tcp and cma, UCX's target side checks
    /// no registration: a peer's put still on its way lands in it anyway. Deregister a
    /// region peers write into only after their last WRITE's immediate (as the trait asks);
    /// a region that is dropped instead stays mapped and allocated until the endpoint goes.
    fn deregister(&mut self, mr: UcxMr) -> Result<Memory> {
        self.unmap_region(mr)
    }

    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<UcxKey>> {
        let ep = self.peer(peer)?.ep;
        let framed = frame::unwrap(Kind::Rkey, mr.key.as_bytes(), "remote key")?;
        // The first byte: host memory (1) or GPU memory (2), the region's token's 8 bytes
        // next; UCX's packed key follows.
        let (host, token, packed) = match framed.split_first() {
            Some((&kind, rest)) if (kind == KEY_HOST || kind == KEY_GPU) && rest.len() > 8 => {
                let mut t = [0u8; 8];
                t.copy_from_slice(&rest[..8]);
                (kind == KEY_HOST, u64::from_le_bytes(t), &rest[8..])
            }
            _ => {
                return Err(bad_key(
                    "the remote key has no memory-type byte and token before UCX's packed key"
                        .into(),
                ))
            }
        };
        let mut rkey: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: ep is live; the packed bytes passed the frame check (their length and hash
        // are those ucp_rkey_pack gave the peer) and outlive the call; rkey a valid out ptr.
        let st =
            unsafe { sys::ucp_ep_rkey_unpack(ep, packed.as_ptr() as *const c_void, &mut rkey) };
        if st != sys::UCS_OK {
            return Err(bad_key(format!(
                "ucp_ep_rkey_unpack refused the remote key: {} (is the region still registered?)",
                status_text(st)
            )));
        }
        let index = self.imported.len() as u32;
        let region = RemoteRegion::new(
            mr,
            UcxKey {
                endpoint: self.id,
                index,
            },
        );
        match region {
            Ok(r) => {
                self.imported.push(Imported {
                    peer: peer.0,
                    addr: mr.addr,
                    len: mr.len,
                    rkey,
                    token,
                    host,
                });
                Ok(r)
            }
            Err(e) => {
                // SAFETY: rkey was just unpacked and is destroyed once, here.
                unsafe { sys::ucp_rkey_destroy(rkey) };
                Err(e)
            }
        }
    }

    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, UcxMr>, ctx: u64) -> Result<Post> {
        let ep = self.peer(peer)?.ep;
        let addr = self.local(&buf)?;
        // One of a stream (stream.rs): UCX may choose for bandwidth, as for tag_bw's sends; a
        // ping-pong's send keeps the latency protocols, as tag_lat's. (A post refused below as
        // QueueFull counts as posted: it is retried, and only a stream fills the queue.)
        let stream = self.streams.send(self.shared.sends_unfinished.get() > 0);
        let Some(s) = self.take_slot(false) else {
            return Ok(Post::QueueFull);
        };
        s.state.set(State::Send);
        s.ctx.set(ctx);
        let i = s.index;
        let mut p = Self::params(s);
        stream::ask(&mut p, stream);
        Self::set_memory(self.name_memory, &mut p, buf.mr);
        // SAFETY: ep is live; [addr, addr + len) lies in a region this endpoint registered
        // (checked), which the caller keeps alive until the completion, and so its mapping
        // (the memh named in p); the slot outlives the operation.
        let r = unsafe { sys::ucp_tag_send_nbx(ep, addr, buf.len, SEND_TAG, &p) };
        self.started(i, "ucp_tag_send_nbx", r)
    }

    fn post_recv(&mut self, buf: LocalSlice<'_, UcxMr>, ctx: u64) -> Result<Post> {
        let addr = self.local(&buf)?;
        // Receives kept posted by the handful ask for UCX's bandwidth protocols too, as
        // tag_bw's do in UCX 1.22 (stream.rs): the flag is part of UCX's protocol selection,
        // the receive side of a rendezvous included.
        let stream = self.streams.recv(self.caps.rx_depth - self.free_rx.len());
        let at_once = self.recv_info_at_once;
        let Some(s) = self.take_slot(true) else {
            return Ok(Post::QueueFull);
        };
        s.state.set(State::Recv);
        s.ctx.set(ctx);
        let i = s.index;
        let mut p = Self::params(s);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_RECV_INFO;
        if !at_once {
            p.op_attr_mask |= sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        }
        stream::ask(&mut p, stream);
        p.cb.recv = Some(on_recv);
        p.recv_info.tag_info = s.info.get();
        Self::set_memory(self.name_memory, &mut p, buf.mr);
        // SAFETY: the worker is live; the buffer lies in a region of this endpoint (checked)
        // kept alive until the completion, and so its mapping (the memh named in p);
        // recv_info points at the slot's `info`, which lives with the endpoint.
        let r =
            unsafe { sys::ucp_tag_recv_nbx(self.worker, addr, buf.len, SEND_TAG, u64::MAX, &p) };
        self.started(i, "ucp_tag_recv_nbx", r)
    }

    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, UcxMr>,
        remote: RemoteSlice<UcxKey>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        let ep = self.peer(peer)?.ep;
        let addr = self.local(&buf)?;
        let k = remote.key;
        let imp = match self.imported.get(k.index as usize) {
            Some(imp) if k.endpoint == self.id && imp.peer == peer.0 => imp,
            _ => {
                return Err(bad_key(format!(
                    "remote key {k:?} was not imported for peer {} on this endpoint",
                    peer.0
                )))
            }
        };
        let fits = remote.addr >= imp.addr
            && remote
                .addr
                .checked_add(remote.len)
                .is_some_and(|end| end <= imp.addr + imp.len)
            && remote.len == buf.len as u64;
        if !fits {
            return Err(bad_key(format!(
                "remote range {:#x}+{} is outside the imported region {:#x}+{} (or its length \
                 differs from the local {} bytes)",
                remote.addr, remote.len, imp.addr, imp.len, buf.len
            )));
        }
        let rkey = imp.rkey;
        // A WRITE may go as one active message carrying its bytes: the target's handler lands
        // them, then queues the immediate if any. Every WRITE to a peer whose WRITEs between
        // these memories are active messages does (`write=am`; by default where UCX would
        // emulate the put: over tcp, whose target answers each put and aborts where the
        // initiator died, and into or out of GPU memory where no lane reaches both): eager
        // into host memory, as a rendezvous into GPU memory. A small one with an immediate
        // between host memories does always, where every earlier put to this peer is known
        // at the target (a flush covering it completed).
        let pr = &self.peers[peer.0 as usize];
        let token = imp.token;
        let into_gpu = !imp.host;
        let from_host = buf.mr.mtype == sys::UCS_MEMORY_TYPE_HOST;
        let am = pr.am_writes[crate::write_kind(!from_host, into_gpu)];
        let flushed = pr.puts.get() == pr.flushed.get();
        let whole = match imm {
            None => am,
            Some(_) => flushed && (am || (imp.host && from_host && buf.len <= INLINE_MAX)),
        };
        let (named, origin) = (self.name_memory, self.origin);
        // A put of a stream asks for UCX's bandwidth protocols, as ucp_put_bw's (stream.rs).
        let stream = self.streams.write();
        let Some(s) = self.take_slot(false) else {
            return Ok(Post::QueueFull);
        };
        s.ctx.set(ctx);
        s.peer.set(peer.0);
        let i = s.index;
        match imm {
            _ if whole => {
                let (id, state) = match imm {
                    Some(_) => (AM_WRITE_IMM, State::Notify),
                    None => (AM_WRITE, State::Put),
                };
                s.state.set(state);
                s.hdr
                    .set(write_header(imm.unwrap_or(0), remote.addr, token, origin));
                let mut p = Self::params(s);
                p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
                p.flags = if into_gpu {
                    sys::UCP_AM_SEND_FLAG_RNDV
                } else {
                    sys::UCP_AM_SEND_FLAG_EAGER
                };
                Self::set_memory(named, &mut p, buf.mr);
                // SAFETY: ep is live; the header is the slot's `hdr`, unchanged until the send
                // completes (the slot is busy until then); the data is the local range, in a
                // region of this endpoint (checked) kept alive until the completion, and so
                // its mapping (the memh named in p).
                let r = unsafe {
                    sys::ucp_am_send_nbx(
                        ep,
                        id,
                        s.hdr.as_ptr() as *const c_void,
                        INLINE_HDR,
                        addr,
                        buf.len,
                        &p,
                    )
                };
                self.started(i, "ucp_am_send_nbx", r)
            }
            None => {
                s.state.set(State::Put);
                let mut p = Self::put_params(named, Some(s), buf.mr);
                stream::ask(&mut p, stream);
                // SAFETY: ep and rkey are live (the rkey was unpacked for this ep and is
                // destroyed only with the endpoint); the local range lies in a region of this
                // endpoint, and so in its mapping (the memh named in p), alive until the
                // completion; the remote range lies in the imported region (checked above).
                let r = unsafe { sys::ucp_put_nbx(ep, addr, buf.len, remote.addr, rkey, &p) };
                let pr = &self.peers[peer.0 as usize];
                pr.puts.set(pr.puts.get() + 1);
                self.started(i, "ucp_put_nbx", r)
            }
            Some(v) => {
                s.state.set(State::Flush);
                s.imm.set(imm_header(v, origin));
                let mut no_cb = Self::put_params(named, None, buf.mr);
                stream::ask(&mut no_cb, stream);
                // SAFETY: as for the put above; no callback: the request (if any) is freed at
                // once and UCX releases it when it completes; the flush below reports it.
                let r = unsafe { sys::ucp_put_nbx(ep, addr, buf.len, remote.addr, rkey, &no_cb) };
                match sys::ptr_status(r) {
                    // SAFETY: a request without callback, released once; UCX frees it when done.
                    Ok(Some(req)) => unsafe { sys::ucp_request_free(req) },
                    Ok(None) => {}
                    Err(st) => {
                        self.give_back(i);
                        return Err(provider_error("ucp_put_nbx", st, "the peer may be gone"));
                    }
                }
                let pr = &self.peers[peer.0 as usize];
                pr.puts.set(pr.puts.get() + 1);
                let s = &self.shared.slots[i as usize];
                s.seq.set(pr.puts.get());
                let p = Self::params(s);
                // SAFETY: ep is live; the slot outlives the flush.
                let r = unsafe { sys::ucp_ep_flush_nbx(ep, &p) };
                self.started(i, "ucp_ep_flush_nbx", r)
            }
        }
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        if self.progress_due() {
            let worker = self.worker;
            burst(
                self.burst,
                // SAFETY: the worker is live; callbacks run inside and only touch the slab
                // through shared references; no borrow of its RefCells is held across the call.
                || unsafe { sys::ucp_worker_progress(worker) },
                || self.tx_unfinished(),
            );
        }
        let mut n = 0;
        // Finished inside their post calls: no request, no further step.
        let take = self.instant.len().min(out.len());
        for (k, o) in out[..take].iter_mut().enumerate() {
            let i = self.instant[k];
            // A send, receive, put or immediate (flushes take the general path).
            let s = &self.shared.slots[i as usize];
            if s.state.get() == State::Recv {
                self.streams.received();
            }
            *o = Completion {
                ctx: s.ctx.get(),
                kind: s.finished(),
            };
            self.give_back(i);
        }
        if take > 0 {
            self.instant.drain(..take);
            n = take;
        }
        while n < out.len() {
            let Some(imm) = self.shared.imms.borrow_mut().pop_front() else {
                break;
            };
            out[n] = Completion {
                ctx: 0,
                kind: CompletionKind::RemoteWrite { imm },
            };
            self.streams.notified();
            n += 1;
        }
        while n < out.len() {
            let Some(i) = self.shared.done.pop() else {
                break;
            };
            let s = &self.shared.slots[i as usize];
            // Its callback ran (that queued the slot): UCX is done with the slot's request.
            s.req.set(ptr::null_mut());
            let (st, ctx, state) = (s.status.get(), s.ctx.get(), s.state.get());
            if state == State::Flush && st == sys::UCS_OK {
                // Every put posted before this flush is at the target.
                let pr = &self.peers[s.peer.get() as usize];
                pr.flushed.set(pr.flushed.get().max(s.seq.get()));
            }
            let c = match state {
                State::Flush if st == sys::UCS_OK => match self.notify(i) {
                    Ok(false) => continue,
                    Ok(true) => Completion {
                        ctx,
                        kind: CompletionKind::Write,
                    },
                    Err(e) => Self::completion_error(Op::Write, ctx, e, "sending the immediate"),
                },
                State::Flush => Self::completion_error(Op::Write, ctx, st, "put and flush"),
                _ if st != sys::UCS_OK => {
                    let (op, what) = match state {
                        State::Send => (Op::Send, "tagged send"),
                        State::Recv => (Op::Recv, "tagged receive"),
                        State::Notify => (Op::Write, "sending the immediate"),
                        _ => (Op::Write, "put or active message"),
                    };
                    Self::completion_error(op, ctx, st, what)
                }
                State::Recv => {
                    self.streams.received();
                    Completion {
                        ctx,
                        kind: s.finished(),
                    }
                }
                State::Send | State::Put | State::Notify => Completion {
                    ctx,
                    kind: s.finished(),
                },
                State::Free => continue,
            };
            self.give_back(i);
            out[n] = c;
            n += 1;
        }
        Ok(n)
    }

    fn caps(&self) -> &Caps {
        &self.caps
    }

    /// Inline, and nothing to do for host memory: the ping-pong calls it between a message's
    /// arrival and the answer.
    #[inline]
    fn make_gpu_visible(&mut self, mr: &UcxMr) -> Result<()> {
        if mr.mtype == sys::UCS_MEMORY_TYPE_HOST {
            return Ok(());
        }
        transport_core::make_gpu_visible(mr.memory(), self.landing)
    }

    fn details(&self) -> String {
        format!(
            "ucx {} TLS={} NET_DEVICES={} immediates: put, ep flush, active message",
            self.version, self.tls, self.devices
        )
    }

    fn runtime(&self) -> Runtime {
        let mut settings = BTreeMap::new();
        settings.insert("tls".into(), self.tls.clone());
        settings.insert("net_devices".into(), self.devices.clone());
        // Per peer under `write=auto`: what was decided so far ("auto" before any peer).
        let write = match self.write {
            Write::Am => "am".to_string(),
            Write::Put => "put".to_string(),
            Write::Auto => crate::auto_writes(self.peers.iter().map(|p| p.am_writes)),
        };
        settings.insert(
            "immediate".into(),
            match write.as_str() {
                "am" => "ucp_am_send_nbx (with the bytes)",
                "put" => "ucp_put_nbx, ucp_ep_flush_nbx, ucp_am_send_nbx",
                _ => "per peer and memories: ucp_am_send_nbx (with the bytes), or ucp_put_nbx, ucp_ep_flush_nbx, ucp_am_send_nbx",
            }
            .into(),
        );
        settings.insert("write".into(), write);
        settings.insert("cuda_memory".into(), self.ctx.cuda.to_string());
        settings.insert(
            "memh".into(),
            if self.name_memory { "on" } else { "off" }.into(),
        );
        settings.insert("progress_burst".into(), self.burst.to_string());
        settings.insert(
            "err_mode".into(),
            if self.peer_errors { "peer" } else { "none" }.into(),
        );
        Runtime {
            backend: Self::BACKEND.into(),
            library: "ucx".into(),
            version: Some(self.version.clone()),
            path: mapped_library("libucp"),
            provider: Some(self.tls.clone()),
            fabric: None,
            device: self.devices.clone(),
            firmware: None,
            settings,
        }
    }
}
