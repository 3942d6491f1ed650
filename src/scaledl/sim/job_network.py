"""The network a simulated job runs on: the preset or calibrated links, the job's overrides,
the software stack's share of the links' rates and the host CPU's costs of TCP
(docs/simulation.md, "What real clusters lose")."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from scaledl.collectives.auto import CostModel
from scaledl.collectives.cost import reduce_scatter_is_allreduce
from scaledl.sim.losses import stack
from scaledl.sim.device_model import Device
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.presets import TCP_LINKS, build_network, burst_bytes, device

if TYPE_CHECKING:
    from scaledl.sim.job import Job

__all__ = ["job_network"]


def job_network(job: Job) -> Network:
    """Preset or calibrated links with any overrides applied, at the stack's measured share of
    their rates (not a calibration's, which measured the library already), with the device's
    TCP costs where bytes go through sockets."""
    dev = device(job.device)
    if job.calibration is not None:
        try:
            model = CostModel.from_json(Path(job.calibration).read_text())
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"--calibration {job.calibration} is not a calibration (no links "
                             "of the form `scaledl simulate calibrate` writes); write one with "
                             "`scaledl simulate calibrate BENCH.json -o FILE`") from None
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read calibration {job.calibration}: {error}; "
                             "write one with `scaledl simulate calibrate BENCH.json -o FILE`"
                             ) from None
        net = replace(Network.from_cost_model(model), oversubscription=job.oversubscription,
                      burst_bytes=burst_bytes(job.network))
    else:
        net = build_network(job.network, job.intra or dev.intra, dev.gamma,
                            job.oversubscription, job.uplink)
    inter = _override(net.inter, job.inter_latency_us, job.inter_gbps)
    intra = _override(net.intra, job.intra_latency_us, job.intra_gbps)
    uplink = net.uplink
    if uplink is not None and (job.inter_latency_us is not None or job.inter_gbps):
        uplink = _override(uplink, job.inter_latency_us, job.inter_gbps)
    burst = 0.0 if job.inter_gbps else net.burst_bytes  # an overridden rate is not tbf's
    net = replace(net, inter=inter, intra=intra, uplink=uplink, burst_bytes=burst,
                  native_reduce_scatter_allreduce=reduce_scatter_is_allreduce(dev.backend))
    if not job.ideal:
        if job.calibration is None:  # a calibration measured the library's rates already
            share = stack(job.stack_name()).link_efficiency
            net = replace(net, intra=_share(net.intra, share), inter=_share(net.inter, share),
                          uplink=None if net.uplink is None else _share(net.uplink, share))
        gloo = dev.backend == "gloo"
        sockets = gloo or net.inter.name in TCP_LINKS
        net = replace(net, cpu_beta=_socket_beta(job, dev) if sockets else 0.0,
                      tcp_inside=gloo, cpu_beta_link=dev.tcp_link_beta,
                      cpu_timeshare=dev.tcp_timeshare)
    return net


def _socket_beta(job: Job, dev: Device) -> float:
    """Host CPU seconds per byte at each end of a socket: ``--socket-bandwidth`` if given,
    else a CPU profile's loopback stream (when it measured one) where Gloo moves the bytes (the
    host the profile was taken on; docs/simulation.md, "Measured profiles"), else the device
    preset's.

    A CUDA profile's stream is not used: a GPU host's sockets are NCCL's, whose preset rate
    (``GPU_HOST_TCP_BETA``) includes its proxy thread and copies, which a raw stream does not.
    A stream measures the host's TCP stack only; what a link beyond the host adds
    (``tcp_link_beta``) stays the preset's."""
    if job.socket_gbps is not None:
        return 1e-9 / job.socket_gbps
    measured = job.measured()
    if (measured is not None and dev.backend == "gloo" and measured.tcp_beta > 0
            and measured.device.get("type") == "cpu"):
        return measured.tcp_beta
    return dev.tcp_beta


def _override(link: LinkClass, latency_us: float | None, gbps: float | None) -> LinkClass:
    if latency_us is not None and (not math.isfinite(latency_us) or latency_us < 0):
        raise ValueError(f"latency {latency_us} us must be >= 0")
    alpha = link.alpha if latency_us is None else latency_us * 1e-6
    if gbps is None:
        return replace(link, alpha=alpha)
    return LinkClass.from_bandwidth(link.name, alpha, gbps)


def _share(link: LinkClass, efficiency: float) -> LinkClass:
    """``link`` at ``efficiency`` of its rate (a library's measured share of it)."""
    return link if efficiency == 1.0 else replace(link, beta=link.beta / efficiency)
