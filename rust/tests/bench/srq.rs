// SPDX-License-Identifier: GPL-2.0

//! The SRQ pool benchmark.

use crate::kunit::{kassert, Failed, TestResult};
use crate::tests::fixtures::{guest::required, stream::now_ns};

use kernel::{c_str, prelude::*};

use crate::tests::fixtures::{srq::*, REPS};

/// The SRQ pool benchmark: receive-buffer bytes and ops/s for 64 QPs, per-QP receive queues of 256 against an
/// SRQ pool of 4 SRQs of 256, buffers of 4 KiB, side by side with the order rotated.
pub(crate) fn srq_bench() -> TestResult {
    const QPS: usize = 64;
    const PER_QP: u32 = 256;
    let dev = required(c_str!("rxe0"))?;
    let setups = [
        (Recv::PerQp { depth: 256 }, "per_qp_rq"),
        (Recv::Pool { nr: 4, size: 256 }, "srq_pool"),
    ];
    for rep in 0..REPS {
        for j in 0..2 {
            let (recv, label) = setups[(rep + j) % 2];
            let f = Fleet::new(dev.device(), QPS, PER_QP, recv, 4096);
            kassert!(f.is_ok(), "{}: {:?}", label, f.as_ref().err());
            let f = f.map_err(|_| Failed)?;
            let bytes = f.recv_bytes();
            let t = now_ns();
            f.run(8)?;
            let ns = (now_ns() - t).max(1);
            // After the run too: an SRQ that grew under the load shows here.
            let end = f.recv_bytes();
            pr_info!(
                "ibext-bench: {{\"bench\":\"srq\",\"setup\":\"{}\",\"qps\":{},\"vectors\":4,\"entries\":256,\"buf_size\":4096,\"ops\":{},\"rep\":{},\"order\":{},\"recv_bytes\":{},\"recv_bytes_end\":{},\"ops_per_s\":{}}}\n",
                label,
                QPS,
                QPS as u32 * PER_QP,
                rep,
                j,
                bytes,
                end,
                (QPS as u64 * u64::from(PER_QP)) * 1_000_000_000 / ns
            );
        }
    }
    Ok(())
}
