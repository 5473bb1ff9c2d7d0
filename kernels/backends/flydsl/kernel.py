"""moetune's FlyDSL grouped-GEMM (MoE) kernel for CDNA3 (gfx942) and CDNA4 (gfx950).

out[rows of group g] = lhs[rows of group g] @ rhs[g], rows grouped contiguously by expert as
jax.lax.ragged_dot takes them; rows past sum(group_sizes) are written as zeros. Operands are bf16, f16
or the arch's fp8 e4m3 flavour (fnuz on gfx942, OCP on gfx950); accumulation is float32 in MFMA.

This module imports flydsl and therefore runs only inside the compile worker's interpreter (compile.py);
everything the host needs to launch the result (grid, block, argument order) lives in plan.py.

One workgroup computes one (tile_m x tile_n) output tile:
  1. Tile -> work: the 1-D workgroup id is optionally remapped across XCDs (xcd_swizzle), then split into
     (m_slot, n_tile) in `tile_order`. A scan over group_sizes (unrolled over G, scalar loads) finds the
     group whose row tiles contain m_slot, the tile's first row and its valid row count. The slots after
     the last group's tiles cover the tail rows past sum(group_sizes): they skip the K loop and store zeros.
     Slots past everything exit.
  2. Main loop over K tiles: 128-bit buffer loads global -> registers, registers -> LDS (XOR-swizzled),
     LDS -> MFMA operand registers, MFMA. lds_stages=2 double-buffers LDS so the next tile's global loads
     overlap the current tile's MFMAs with one barrier per tile; lds_stages=1 uses two barriers.
     With k_waves > 1 the waves are split into K groups that each take a K slice of every tile; their
     float32 partials meet in LDS at the end (reusing the operand buffers) and the first group adds them.
  3. Store: float32 -> out dtype, buffer stores whose descriptor ends at the tile's last valid row, so
     rows of the next group (and past M) are never written.

Buffer descriptors bound every access: A's ends at row M, C's at the tile's last valid row, B's at the
expert's last element; hardware drops out-of-range stores and reads zeros.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

from .plan import KernelPlan

_ELEMENT_TYPES = {
    "bfloat16": "BFloat16",
    "float16": "Float16",
    "float8_e4m3fnuz": "Float8E4M3FNUZ",
    "float8_e4m3fn": "Float8E4M3FN",
}


def element_type(dtype: str):
    return getattr(fx, _ELEMENT_TYPES[dtype])


def build(plan: KernelPlan):
    """The @flyc.jit launcher for `plan`: launch(lhs, rhs, group_sizes, out) with raw device pointers."""
    problems = plan.violations()
    if problems:
        raise ValueError("; ".join(problems))

    in_t = element_type(plan.in_dtype)
    out_t = element_type(plan.out_dtype)
    in_bytes = plan.in_bits // 8
    out_bytes = 2
    M, K, N, G = plan.m, plan.k, plan.n, plan.g
    TM, TN, TK = plan.tile_m, plan.tile_n, plan.tile_k
    STAGES = plan.lds_stages
    KW = plan.k_waves
    THREADS = plan.threads
    THREADS_MN = plan.threads_mn
    VEC = plan.vec
    N_TILES = plan.n_tiles
    K_TILES = plan.k_tiles
    FULL_PAIRS = (K_TILES - 1) // 2
    M_SLOTS = plan.m_slots
    GRID = plan.grid[0]
    XCDS = plan.xcd_swizzle
    MFMA_M, MFMA_N, MFMA_K = plan.mfma_shape
    STEPS = plan.k_steps_per_wave
    KK = TK // KW  # K extent of one K-wave group's slice of a tile
    swz_bits, swz_base, swz_shift = plan.swizzle
    s2r_bits = plan.mfma_k_per_lane * plan.in_bits
    frag_c = TM * TN // THREADS_MN  # float32 accumulators per thread
    red_elems = max(1, (KW - 1) * TM * TN)
    a_elems = STAGES * TM * TK
    b_elems = STAGES * TN * TK

    @fx.struct
    class Operands:
        a: fx.Array[in_t, a_elems, 16]
        b: fx.Array[in_t, b_elems, 16]

    @fx.union
    class Shared:
        operands: Operands
        partials: fx.Array[fx.Float32, red_elems, 16]

    def lds_layout(rows):
        ordered = fx.make_ordered_layout((rows, TK, STAGES), order=(1, 0, 2))
        if const_expr(swz_bits == 0):
            return ordered
        return fx.make_composed_layout(fx.static(fx.SwizzleType.get(swz_bits, swz_base, swz_shift)), ordered)

    def g2s_copy(atom, rows, contiguous_k):
        # All threads sweep a (rows, TK) tile in 128-bit vectors along the contiguous dimension.
        if const_expr(contiguous_k):
            lanes = TK // VEC
            thr = fx.make_ordered_layout((THREADS // lanes, lanes), order=(1, 0))
            val = fx.make_ordered_layout((1, VEC), order=(1, 0))
        else:
            lanes = rows // VEC
            thr = fx.make_ordered_layout((lanes, THREADS // lanes), order=(0, 1))
            val = fx.make_ordered_layout((VEC, 1), order=(0, 1))
        return fx.make_tiled_copy_tv(atom, thr, val)

    def workgroup_tile(bid):
        """(m_slot, n_tile) of this workgroup after the optional XCD remap and the tile order."""
        pid = bid
        if const_expr(XCDS > 1):
            # Workgroups are dealt round-robin to XCDs; renumber so each XCD gets a contiguous range of
            # tiles (shared A rows / B columns stay in one XCD's L2). q, r: tiles per XCD, remainder.
            q, r = GRID // XCDS, GRID % XCDS
            xcd = bid % XCDS
            local = bid // XCDS
            first = (xcd < r).select(xcd * (q + 1), xcd * q + r)
            pid = first + local
        if const_expr(plan.tile_order == "n_major"):
            return pid % M_SLOTS, pid // M_SLOTS
        return pid // N_TILES, pid % N_TILES

    @flyc.kernel
    def moetune_flydsl_gmm(lhs: fx.Pointer, rhs: fx.Pointer, group_sizes: fx.Pointer, out: fx.Pointer):
        tid = fx.thread_idx.x
        m_slot, n_tile = workgroup_tile(fx.block_idx.x)

        # Scan the groups: which group's row tiles hold m_slot (unrolled over G, scalar loads).
        start = fx.Int32(0)
        tiles_before = fx.Int32(0)
        row_start = fx.Int32(0)
        rows = fx.Int32(0)
        group = fx.Int32(0)
        in_group = fx.Boolean(False)
        for gi in range_constexpr(G):
            # Clamp each size into [0, M - start]: a routing summing past M still stays inside lhs.
            size = fx.min(fx.max((group_sizes + gi).load(), fx.Int32(0)), fx.Int32(M) - start)
            count = (size + (TM - 1)) // TM
            local = m_slot - tiles_before
            hit = (m_slot >= tiles_before) & (local < count)
            row_start = hit.select(start + local * TM, row_start)
            rows = hit.select(fx.min(size - local * TM, fx.Int32(TM)), rows)
            group = hit.select(fx.Int32(gi), group)
            in_group = in_group | hit
            start = start + size
            tiles_before = tiles_before + count
        # Tail rows past sum(group_sizes): zeros.
        tail_local = m_slot - tiles_before
        tail = (m_slot >= tiles_before) & (tail_local < (fx.Int32(M) - start + (TM - 1)) // TM)
        row_start = tail.select(start + tail_local * TM, row_start)
        rows = tail.select(fx.min(fx.Int32(M) - start - tail_local * TM, fx.Int32(TM)), rows)

        if rows > 0:
            mma_atom = fx.make_mma_atom(fx.rocdl.MFMA(MFMA_M, MFMA_N, MFMA_K, in_t))
            tiled_mma = fx.make_tiled_mma(
                mma_atom, fx.make_layout((plan.waves_m, plan.waves_n, 1), (1, plan.waves_m, 0))
            )
            if const_expr(KW > 1):
                mma_tid = tid % THREADS_MN
                kw = tid // THREADS_MN
            else:
                mma_tid = tid
                kw = fx.Int32(0)
            thr_mma = tiled_mma.thr_slice(mma_tid)

            # Global views. A: this tile's rows (descriptor ends at row M); B: this expert;
            # C: this tile's valid rows only.
            a_view = fx.make_view(lhs + row_start * K, fx.make_layout((TM, K), (K, 1)))
            A = fx.rocdl.make_buffer_tensor(
                a_view, max_size=False, num_records_bytes=fx.Int64(fx.Int32(M) - row_start) * (K * in_bytes)
            )
            if const_expr(plan.transpose_rhs):
                b_layout = fx.make_layout((N, K), (K, 1))  # rhs [G, N, K]
            else:
                b_layout = fx.make_layout((N, K), (1, N))  # rhs [G, K, N]
            B = fx.rocdl.make_buffer_tensor(fx.make_view(rhs + group * (K * N), b_layout), max_size=False)
            c_view = fx.make_view(out + row_start * N, fx.make_layout((TM, N), (N, 1)))
            C = fx.rocdl.make_buffer_tensor(
                c_view, max_size=False, num_records_bytes=fx.Int64(rows) * (N * out_bytes)
            )
            gA = fx.flat_divide(A, (TM, TK))[None, None, 0, None]  # (TM, TK, k_tiles)
            gB = fx.flat_divide(B, (TN, TK))[None, None, n_tile, None]  # (TN, TK, k_tiles)
            gC = fx.flat_divide(C, (TM, TN))[None, None, 0, n_tile]  # (TM, TN)

            shared = fx.SharedAllocator().allocate(Shared)
            operands = shared.operands.peek()
            sA = fx.make_view(operands.a.ptr, lds_layout(TM))  # (TM, TK, stages)
            sB = fx.make_view(operands.b.ptr, lds_layout(TN))  # (TN, TK, stages)

            load_atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), in_t)
            store128 = fx.make_copy_atom(fx.UniversalCopy128b(), in_t)
            read_atom = fx.make_copy_atom(fx.UniversalCopy(s2r_bits), in_t)
            # fx.copy moves one atom's worth of values per call, as the tiled copy that partitioned the
            # tensors defines it: a store through a narrower atom needs its own tiled copy (and retile).
            g2s_a = g2s_copy(load_atom, TM, True).get_slice(tid)
            g2s_b = g2s_copy(load_atom, TN, plan.transpose_rhs).get_slice(tid)
            src_a = g2s_a.partition_S(gA)  # (V, rows, cols, k_tiles)
            src_b = g2s_b.partition_S(gB)
            dst_a = g2s_a.partition_D(sA)  # (V, rows, cols, stages)
            reg_a = fx.make_fragment_like(dst_a[None, None, None, 0])
            reg_b = fx.make_fragment_like(g2s_b.partition_D(sB)[None, None, None, 0])
            if const_expr(plan.transpose_rhs):
                b_store = store128
                dst_b = g2s_b.partition_D(sB)
                reg_b_out = reg_b
            else:
                # B stored [K, N] is read along N and transposed on its way into LDS, one element per
                # store, so the MFMA operand reads always find K contiguous in LDS.
                b_store = fx.make_copy_atom(fx.UniversalCopy(plan.in_bits), in_t)
                r2s_b = g2s_copy(b_store, TN, False).get_slice(tid)
                dst_b = r2s_b.partition_D(sB)
                reg_b_out = r2s_b.retile(reg_b)

            s2r_a = fx.make_tiled_copy_A(read_atom, tiled_mma).get_slice(mma_tid)
            s2r_b = fx.make_tiled_copy_B(read_atom, tiled_mma).get_slice(mma_tid)
            lds_a = s2r_a.partition_S(sA)  # (V, m_rep, k_steps, stages)
            lds_b = s2r_b.partition_S(sB)
            # Operand fragments for one K-wave slice of a tile (the slice's shape is all that matters).
            frag_a = thr_mma.make_fragment_A(fx.flat_divide(sA[None, None, 0], (TM, KK))[None, None, 0, 0])
            frag_b = thr_mma.make_fragment_B(fx.flat_divide(sB[None, None, 0], (TN, KK))[None, None, 0, 0])
            frag_a_in = s2r_a.retile(frag_a)
            frag_b_in = s2r_b.retile(frag_b)
            acc = thr_mma.make_fragment_C(gC)
            acc.fill(0)

            def load_tile(kt):
                fx.copy(load_atom, src_a[None, None, None, kt], reg_a)
                fx.copy(load_atom, src_b[None, None, None, kt], reg_b)

            def store_tile(stage):
                fx.copy(store128, reg_a, dst_a[None, None, None, stage])
                fx.copy(b_store, reg_b_out, dst_b[None, None, None, stage])

            def mma_tile(stage):
                for step in range_constexpr(STEPS):
                    k_step = kw * STEPS + step
                    fx.copy(read_atom, lds_a[None, None, k_step, stage], frag_a_in[None, None, step])
                    fx.copy(read_atom, lds_b[None, None, k_step, stage], frag_b_in[None, None, step])
                    fx.gemm(tiled_mma, acc, frag_a[None, None, step], frag_b[None, None, step], acc)

            if in_group:
                load_tile(0)
                store_tile(0)
                fx.gpu.barrier()
                if const_expr(STAGES == 2):
                    # Pairs of K tiles keep each LDS stage index static; the loop covers the pairs whose
                    # two prefetches (tiles 2p+1, 2p+2) exist, the static tail the last one or two tiles.
                    for kp in range(FULL_PAIRS):
                        load_tile(kp * 2 + 1)
                        mma_tile(0)
                        store_tile(1)
                        fx.gpu.barrier()
                        load_tile(kp * 2 + 2)
                        mma_tile(1)
                        store_tile(0)
                        fx.gpu.barrier()
                    if const_expr(K_TILES - 2 * FULL_PAIRS == 2):
                        load_tile(K_TILES - 1)
                        mma_tile(0)
                        store_tile(1)
                        fx.gpu.barrier()
                        mma_tile(1)
                    else:
                        mma_tile(0)
                else:
                    for kt in range(K_TILES - 1):
                        load_tile(kt + 1)
                        mma_tile(0)
                        fx.gpu.barrier()
                        store_tile(0)
                        fx.gpu.barrier()
                    mma_tile(0)

                if const_expr(KW > 1):
                    # Partials of K groups 1.. go through LDS (the operand buffers are free now): element i
                    # of thread t in group w sits at ((w-1)*frag_c + i)*THREADS_MN + t, so a wave's lanes
                    # touch consecutive words.
                    fx.gpu.barrier()
                    partials = fx.make_view(shared.partials.peek().ptr, fx.make_layout(red_elems, 1))
                    if kw > 0:
                        for i in range_constexpr(frag_c):
                            partials[((kw - 1) * frag_c + i) * THREADS_MN + mma_tid] = acc[i]
                    fx.gpu.barrier()
                    if kw == 0:
                        for w in range_constexpr(KW - 1):
                            for i in range_constexpr(frag_c):
                                acc[i] = acc[i] + partials[(w * frag_c + i) * THREADS_MN + mma_tid]

            if kw == 0:
                result = fx.make_fragment_like(acc, out_t)
                result.store(acc.load().to(out_t))
                out_atom = fx.make_copy_atom(fx.rocdl.BufferCopy16b(), out_t)
                r2g = fx.make_tiled_copy_C(out_atom, tiled_mma).get_slice(mma_tid)
                fx.copy(out_atom, r2g.retile(result), r2g.partition_S(gC))

    @flyc.jit
    def launch(
        lhs: fx.Pointer,
        rhs: fx.Pointer,
        group_sizes: fx.Pointer,
        out: fx.Pointer,
    ):
        # No stream parameter: FlyDSL adds its default one; moetune launches the HSACO itself anyway.
        moetune_flydsl_gmm(lhs, rhs, group_sizes, out).launch(grid=plan.grid, block=plan.block)

    return launch
