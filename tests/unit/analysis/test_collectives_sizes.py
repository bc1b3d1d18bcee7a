"""Collective sizes where the kernel records none (the DLRM-era traces: the ``nccl:*`` range and the c10d base op
around the launch), and the all-to-all-v size imbalance (per-rank messages; ``In/Out split size``)."""

import pytest
from tracekit import X, write

from distprof.analysis import analyze
from distprof.trace.commargs import CommArgs, comm_args, from_input_dims


def test_input_dims_of_the_ranges_give_the_messages():
    assert from_input_dims([[394241]], ["float"], "nccl:all_reduce") == \
        CommArgs(394241, None, "Float", None, None, None, None)
    # c10d::alltoall_base_(output, input, ...): out first
    assert from_input_dims([[768], [3392], [], []], ["int", "int", "", ""], "c10d::alltoall_base_")[:3] == \
        (3392, 768, "Int")
    assert from_input_dims([[2, 3]], ["c10::BFloat16"], "nccl:all_gather")[:3] == (6, None, "BFloat16")
    # a tensor list records [], odd values are dropped, never raised on
    for dims, types in (([[], [], []], ["TensorList", "", ""]), ([["x"]], ["float"]), ("[[1]]", ["float"]),
                        ([[-4]], ["float"]), ([], [])):
        assert from_input_dims(dims, types, "nccl:all_reduce") is None
    assert from_input_dims([[5]], ["odd"], "nccl:x") == CommArgs(5, None, None, None, None, None, None)


def test_split_sizes_are_read_as_lists_or_strings():
    a = comm_args(6, 6, "Float", 3, None, None, None, "[1, 2, 3]", [3, 2, 1])
    assert (a.in_splits, a.out_splits) == ((1, 2, 3), (3, 2, 1))
    assert comm_args(6, 6, "Float", 3, None, None, None, "[1, x]", None).in_splits is None


def _rank(tmp_path, rank, t0, in_n, out_n, extra=None):
    """One rank: a c10d::alltoall_base_ (output, input) around an nccl:all_to_all range around the launch of a
    SendRecv kernel that records nothing (as torch 2.0 wrote it)."""
    evs = [X("c10d::alltoall_base_", t0, 100, tid=1, **{"Input Dims": [[out_n], [in_n], [], []],
                                                      "Input type": ["float", "float", "", ""]}),
           X("nccl:all_to_all", t0 + 5, 90, tid=1, cat="user_annotation",
             **{"Input Dims": [[in_n]], "Input type": ["float"]}),
           X("cudaLaunchKernel", t0 + 10, 5, tid=1, cat="cuda_runtime", correlation=7 + rank),
           X("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)", t0 + 20, 40, cat="kernel", pid=0, tid=7,
             correlation=7 + rank, stream=7, **(extra or {}))]
    write(tmp_path / f"rank{rank}.json", evs, distributedInfo={"rank": rank, "world_size": 2})


def test_dlrm_era_sizes_and_the_all_to_all_v_imbalance(tmp_path):
    _rank(tmp_path, 0, 1000, 300, 100)
    _rank(tmp_path, 1, 1010, 300, 500)
    (r,) = analyze.summary(str(tmp_path), workers=1)["collectives"]
    assert (r["name"], r["bytes"], r["dtype"], r["busbw_gbps"]) == ("sendrecv", 300 * 4, "Float", None)
    assert r["algbw_gbps"] == pytest.approx(1200 / 40 / 1e3)
    # in-messages alike (300, 300), out-messages not (100, 500; mean 300): 500 / 300
    assert r["imbalance"] == pytest.approx(5 / 3) and r["imbalance_mean"] == pytest.approx(5 / 3)
    assert "split_imbalance" not in r and "group size not recorded" in r["note"]


def test_split_sizes_give_the_split_imbalance(tmp_path):
    def meta(splits):
        return {"Collective name": "all_to_allv", "In msg nelems": sum(splits), "Out msg nelems": sum(splits),
                "dtype": "Float", "Group size": 2, "Process Group Name": "0", "In split size": str(splits),
                "Out split size": str(splits)}
    _rank(tmp_path, 0, 1000, 4, 4, meta([1, 3]))
    _rank(tmp_path, 1, 1010, 4, 4, meta([2, 2]))
    (r,) = analyze.summary(str(tmp_path), workers=1)["collectives"]
    assert r["name"] == "alltoallv" and r["split_imbalance"] == pytest.approx(3 / 2)  # entries 1,3,2,2: mean 2
    assert r["imbalance"] == 1.0  # both ranks send and receive 4
