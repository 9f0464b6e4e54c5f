//! What a producer kernel publishes ([`Produce`]), and the kernel arguments it becomes.

use cudarc::driver::{LaunchArgs, PushKernelArg};

/// What [`Kernels::produce`](super::Kernels::produce) publishes: commands `first..first + count`. Command `i` WRITEs
/// `len` bytes from `local_off + (i % pages) * stride` of local region `local_region` to
/// `remote_off + (i % pages) * stride` of `peer`'s region `remote_region`; with
/// [`OP_WRITE_IMM`](crate::ring::OP_WRITE_IMM) its immediate is
/// [`immediate`](crate::ring::immediate)`(imm_slot, i as u16)`.
#[derive(Clone, Debug)]
pub struct Produce {
    pub first: u64,
    pub count: u64,
    pub peer: u16,
    pub local_region: u16,
    pub local_off: u64,
    pub remote_region: u16,
    pub remote_off: u64,
    pub len: u32,
    pub stride: u64,
    pub pages: u64,
    /// [`OP_WRITE`](crate::ring::OP_WRITE) or [`OP_WRITE_IMM`](crate::ring::OP_WRITE_IMM).
    pub op: u8,
    pub imm_slot: u16,
    /// The u64 (device address) warps claim positions from: `None` for the ring's head;
    /// `Some` for a counter in GPU memory that holds the ring's next position (the only
    /// producer of the ring then).
    pub claim: Option<u64>,
    /// `Some((device address of the local region, salt))`: each thread first fills its
    /// command's payload with [`payload_byte`](super::payload_byte), ordered before the command by the fence.
    pub fill: Option<(u64, u32)>,
    /// Blocks and threads per block of the launch.
    pub blocks: u32,
    pub threads: u32,
    /// Publish through `proxy_ring.cuh`'s `proxy_push` (with `fill`) or `proxy_push_unfenced`
    /// (without), one claim on the ring's head per command, as a program's own kernel would
    /// (`kernels/push_example.cu`), instead of `proxy_produce`'s warp claims. `claim` must be
    /// `None`.
    pub push: bool,
}

/// The commands' arguments both producer kernels take after the ring (`proxy_produce` after
/// its claim counter), as the kernels' types: first, count, peer, local region, local
/// offset, remote region, remote offset, len, stride, pages.
pub(super) struct CommandArgs {
    first: u64,
    count: u64,
    peer: u32,
    local_region: u32,
    local_off: u64,
    remote_region: u32,
    remote_off: u64,
    len: u64,
    stride: u64,
    pages: u64,
}

impl CommandArgs {
    /// Push them onto a launch, in the kernels' order.
    pub(super) fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.first)
            .arg(&self.count)
            .arg(&self.peer)
            .arg(&self.local_region)
            .arg(&self.local_off)
            .arg(&self.remote_region)
            .arg(&self.remote_off)
            .arg(&self.len)
            .arg(&self.stride)
            .arg(&self.pages);
    }
}

impl Produce {
    /// The commands' kernel arguments.
    pub(super) fn command_args(&self) -> CommandArgs {
        CommandArgs {
            first: self.first,
            count: self.count,
            peer: u32::from(self.peer),
            local_region: u32::from(self.local_region),
            local_off: self.local_off,
            remote_region: u32::from(self.remote_region),
            remote_off: self.remote_off,
            len: u64::from(self.len),
            stride: self.stride,
            pages: self.pages,
        }
    }

    /// `cmd` alone, as command `first` of one warp (what [`Kernels::pingpong`](super::Kernels::pingpong) publishes each
    /// round: its immediate's low 16 bits become the round's position).
    pub fn single(cmd: &crate::Command, first: u64) -> Self {
        let (local_region, local_off) = crate::ring::unpack(cmd.local);
        let (remote_region, remote_off) = crate::ring::unpack(cmd.remote);
        Self {
            first,
            count: 1,
            peer: cmd.peer,
            local_region,
            local_off,
            remote_region,
            remote_off,
            len: cmd.len,
            stride: 0,
            pages: 1,
            op: cmd.op,
            imm_slot: (cmd.imm >> crate::ring::ARRIVAL_SHIFT) as u16,
            claim: None,
            fill: None,
            blocks: 1,
            threads: 32,
            push: false,
        }
    }
}
