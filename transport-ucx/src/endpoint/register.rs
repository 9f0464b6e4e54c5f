//! Registration: mapping memory into the UCP context and packing its key, and giving the
//! memory back. The trait's `register` and `deregister` forward here.

use super::*;

impl Endpoint {
    /// `ucp_mem_map` of the memory, its packed key (with the region's kind and token in
    /// front) and its entry among the regions a WRITE may land in.
    pub(super) fn map_region(&mut self, mut mem: Memory) -> Result<UcxMr> {
        if mem.is_empty() {
            return Err(Error::InvalidArgument("cannot register 0 bytes".into()));
        }
        let (base, mtype) = match &mut mem {
            Memory::Host(h) => (h.as_mut_ptr() as usize, sys::UCS_MEMORY_TYPE_HOST),
            Memory::Gpu(g) => {
                if !self.ctx.cuda {
                    return Err(Error::Unsupported(format!(
                        "this UCX ({} at {}) has no CUDA memory support (ucp_context_query \
                         lists no UCS_MEMORY_TYPE_CUDA): use a UCX built with CUDA, e.g. the \
                         libucx-cu12 wheel's, through LD_LIBRARY_PATH",
                        self.version,
                        mapped_library("libucp").unwrap_or_else(|| "libucp".into())
                    )));
                }
                (g.device_ptr() as usize, sys::UCS_MEMORY_TYPE_CUDA)
            }
        };
        let params = sys::ucp_mem_map_params_t {
            field_mask: u64::from(
                sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                    | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                    | sys::UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
            ),
            address: base as *mut c_void,
            length: mem.len(),
            memory_type: mtype,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: [base, base + len) is memory `mem` owns (host buffer or CUDA allocation),
        // which the region keeps, at the same address, until it is unmapped.
        let st = unsafe { sys::ucp_mem_map(self.ctx.ctx, &params, &mut memh) };
        check(
            "ucp_mem_map",
            st,
            "raise `ulimit -l`; GPU memory: is cuda in `ucx_info -d`?",
        )?;
        let map = Mapping {
            memh,
            ctx: self.ctx.clone(),
        };
        let mut buf: *mut c_void = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: memh is the live mapping above; out pointers valid.
        let st = unsafe { sys::ucp_rkey_pack(self.ctx.ctx, memh, &mut buf, &mut size) };
        check(
            "ucp_rkey_pack",
            st,
            "the mapping may be gone: register the region again",
        )?;
        // SAFETY: UCX returned `size` readable bytes at buf, released right after the copy.
        let packed = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: buf came from ucp_rkey_pack; released once.
        unsafe { sys::ucp_rkey_buffer_release(buf) };
        // The key's first byte says whether the region is host memory (1) or GPU memory (2);
        // the region's token follows it (a peer then may carry a WRITE into it as one active
        // message, naming the token); UCX's packed key comes last.
        let token = region_token();
        let kind = if mtype == sys::UCS_MEMORY_TYPE_HOST {
            KEY_HOST
        } else {
            KEY_GPU
        };
        let head = [&[kind][..], &token.to_le_bytes()].concat();
        let key = KeyBytes::new(frame::wrap(Kind::Rkey, &[&head[..], &packed[..]].concat()))
            .map_err(|_| {
                Error::Unsupported(format!(
                "UCX packed a {size}-byte remote key, more than a key may carry ({} bytes with \
                 its frame): name fewer transports (--provider)",
                KeyBytes::MAX_LEN
            ))
            })?;
        self.shared.landable.borrow_mut().push(Landable {
            base,
            len: mem.len(),
            token,
            mtype,
        });
        Ok(UcxMr {
            remote: RemoteMr {
                addr: base as u64,
                len: mem.len() as u64,
                key,
            },
            len: mem.len(),
            mem: Some(mem),
            grave: Arc::downgrade(&self.grave),
            map,
            owner: self.id,
            base,
            mtype,
        })
    }

    /// The memory back, where this endpoint mapped it and no operation of it is in flight
    /// (the trait's `deregister` says why and what happens to a refused region).
    pub(super) fn unmap_region(&mut self, mr: UcxMr) -> Result<Memory> {
        if mr.owner != self.id {
            return Err(Error::InvalidArgument(
                "deregister: the region was registered on another endpoint; deregister it \
                 there. The region is dropped: it stays mapped and allocated until its \
                 endpoint closes"
                    .into(),
            ));
        }
        let busy = self
            .shared
            .slots
            .iter()
            .any(|s| s.state.get() != State::Free)
            || !self.shared.landings.borrow().is_empty();
        if busy {
            return Err(Error::InvalidArgument(
                "deregister: operations of this endpoint are still in flight (a posted \
                 receive, a SEND, WRITE or immediate not completed, a WRITE landing); poll \
                 until they complete first. The region is dropped: it stays mapped and \
                 allocated until the endpoint closes"
                    .into(),
            ));
        }
        let mut mr = mr;
        check(
            "ucp_mem_unmap",
            mr.map.unmap(),
            "finish every operation on the region first",
        )?;
        // A region dropped instead stays in the table: its memory stays allocated (the
        // graveyard) until the endpoint goes.
        let mut regions = self.shared.landable.borrow_mut();
        if let Some(k) = regions
            .iter()
            .position(|r| (r.base, r.len) == (mr.base, mr.len))
        {
            regions.swap_remove(k);
        }
        drop(regions);
        Ok(mr.mem.take().expect(TAKEN))
    }
}
