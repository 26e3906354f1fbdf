"""Preflight reports and the server logs that answer them, for the post-flight's tests (importable:
pyproject sets pythonpath=["tests"]).

A report is the preflight's own (``derive_row`` per rank, the wire round trip, ``decide``, ``to_json``),
so the post-flight reads exactly what ``checker check --report`` writes. A log is rendered from the
table of SGLang's own format strings (:func:`checker.postflight.formats.render_line`): each rank's
``Load weight begin.``, ``Load weight end.``, ``Mamba Cache is allocated.`` lines and, on each stage's
TP 0, the ``max_total_num_tokens=...`` summary, with the prefix the release's scheduler builds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker import __version__
from checker.config import (
    BudgetSource,
    EngineChoice,
    ModelChoice,
    OutputOptions,
    PreflightConfig,
    SizingFlags,
)
from checker.distributed.launch_env import GroupOptions, RankEnv
from checker.distributed.wire import decode_row, encode_row
from checker.outputs.check_run import weights_doc
from checker.outputs.report import to_json
from checker.postflight import formats as F
from checker.preflight.derivation import derive_row, local_facts
from checker.preflight.verdict import decide


def preflight_report(
    n: int,
    *,
    sizing: Mapping[str, object] | None = None,
    budget: BudgetSource | None = None,
    per_node: int = 2,
    release: str = "0.5.23",
    environ: Mapping[int, Mapping[str, str]] | None = None,
    model: ModelChoice | None = None,
    host: str = "node-",
) -> dict[str, Any]:
    """The JSON report of a preflight of ``n`` ranks (kimi-k3 unless ``model``; hosts
    ``node-<rank // per_node>``)."""
    flags = SizingFlags(**{"mamba_full_memory_ratio": 0.5, **dict(sizing or {})})
    config = PreflightConfig(
        model=model or ModelChoice(model="kimi-k3"),
        sizing=flags,
        engine=EngineChoice(sglang_version=release),
        group=GroupOptions(),
        budget=budget or BudgetSource(budget_gib=8.0),
        output=OutputOptions(),
    )
    envs = [
        RankEnv(
            rank=r,
            world_size=n,
            local_rank=r % per_node,
            local_world_size=per_node,
            node_rank=r // per_node,
            host=f"{host}{r // per_node}",
            master_addr=None,
            master_port=None,
            use_agent_store=False,
            restart_count=0,
            max_restarts=0,
        )
        for r in range(n)
    ]
    local = [local_facts(config, e, None) for e in envs]
    rows = [
        decode_row(
            encode_row(
                derive_row(
                    config,
                    e,
                    facts,
                    all_free=[f.device_free_bytes for f in local],
                    torch_version="x",
                    environ=dict((environ or {}).get(e.rank, {})),
                )
            )
        )
        for e, facts in zip(envs, local, strict=True)
    ]
    verdict = decide(rows, world_size=n)
    extra = {"checker_version": __version__, "torch_version": "2.13.0+cpu", "backend": "gloo"}
    extra |= {"timings": {"total_s": 6.2}, **weights_doc(config)}  # what check's rank 0 adds
    return json.loads(json.dumps(to_json(verdict, extra=extra)))


@dataclass
class ServerLog:
    """What each rank's lines say: the prediction's values unless overridden per rank."""

    report: dict[str, Any]
    release: str = "0.5.23"
    weights_gib: Callable[[int], float] = lambda rank: 18.62
    override: dict[int, dict[str, object]] = field(default_factory=dict)
    """rank -> {max_mamba_cache_size, max_running_requests, weights_gib, type, ...}"""
    dp_attention: bool = False
    plain_dp: int = 0
    """Plain DP replicas (each a whole copy of the layout, prefixed DP<d>); 0: none."""
    ep_size: int = 1
    ms: bool = False
    quant: str = ""
    skip: frozenset[int] = frozenset()
    free_gib: float = 120.0
    """What ``Load weight begin. avail mem=`` says: the GPU's free memory before the weights."""

    @property
    def dp_size(self) -> int:
        dp = self.report["inputs"]["dp_size"]
        return dp if isinstance(dp, int) else 1

    def tp(self, rank: dict[str, Any]) -> int:
        """The TP number SGLang's prefix shows: the rank's place in its stage (global under attention DP)."""
        return int(rank["rank"]) % (int(self.report["layout"]["tp_size"]) * self.dp_size)

    def prefix(self, rank: dict[str, Any], replica: int | None) -> str:
        layout = self.report["layout"]
        dp = self.dp_size
        tp_size = int(layout["tp_size"]) * dp
        tp = self.tp(rank)
        attn_tp = tp_size // dp
        ranks: dict[str, int | None] = {
            "PP": rank["pp_rank"],
            "TP": tp,
            "EP": tp // (tp_size // self.ep_size) if self.ep_size > 1 else 0,
            "DP": replica if replica is not None else (tp // attn_tp if self.dp_attention else None),
        }
        sizes = {"pp_size": layout["pp_size"], "tp_size": tp_size, "ep_size": self.ep_size}
        return F.prefix(self.release, ranks, sizes)

    def lines(
        self, rank: dict[str, Any], replica: int | None = None, created: float = 1_767_225_600.0
    ) -> list[str]:
        o = self.override.get(rank["rank"], {})
        pre = self.prefix(rank, replica)
        release = str(o.get("release", self.release))
        k = o.get("max_mamba_cache_size", rank["max_mamba_cache_size"])
        mrr = o.get("max_running_requests", rank["max_running_requests"])
        weights = o.get("weights_gib", self.weights_gib(rank["rank"]))
        state = (k + 1) * (rank["state_allocated_bytes"] // (rank["max_mamba_cache_size"] + 1)) / 2**30
        values = {
            "elapsed": 31.4,
            "type": o.get("type", "KimiLinearForCausalLM"),
            "dtype": "torch.bfloat16",
            "quant_str": self.quant and self.quant + ", ",
            "avail_mem": self.free_gib - float(weights),  # type: ignore[arg-type]
            "mem_usage": weights,
            "max_mamba_cache_size": k,
            "conv_state_size": state * 0.1,
            "ssm_state_size": state * 0.9,
            "max_total_num_tokens": o.get("max_total_num_tokens", rank["max_total_num_tokens"]),
            "chunked_prefill_size": 8192,
            "max_prefill_tokens": 16384,
            "max_running_requests": mrr,
            "context_len": o.get("context_len", rank["context_len"]),
            "_10": "available_gpu_mem",
            "_12": 20.5,
        }
        out = [
            F.render_line(
                release,
                form_of("weights_begin", release).render({"avail_mem": self.free_gib}),
                prefix_text=pre,
                created=created,
                ms=self.ms,
            ),
            F.render_line(
                release,
                form_of("weights", release).render(values),
                prefix_text=pre,
                created=created,
                ms=self.ms,
            ),
            F.render_line(
                release,
                form_of("mamba", release).render(values),
                prefix_text=pre,
                created=created,
                ms=self.ms,
            ),
        ]
        if "capped_from" in o:  # SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: the cap, logged before the summary
            capped = form_of("post_capture", release).render(
                {"max_running_requests": o["capped_from"], "_2": mrr}
            )
            out.append(F.render_line(release, capped, prefix_text=pre, created=created, ms=self.ms))
        if self.tp(rank) == 0:
            out.append(
                F.render_line(
                    release,
                    form_of("summary", release).render(values),
                    prefix_text=pre,
                    created=created,
                    ms=self.ms,
                )
            )
        return out

    def text(self, ranks: list[int] | None = None) -> str:
        """Every rank's lines (``ranks``: those only), rank by rank, each replica after the other."""
        out = []
        for replica in range(self.plain_dp) if self.plain_dp else [None]:
            for rank in self.report["ranks"]:
                if rank["rank"] in self.skip or (ranks is not None and rank["rank"] not in ranks):
                    continue
                out += self.lines(rank, replica)
        return "\n".join(out) + "\n"


def form_of(kind: str, release: str) -> F.Form:
    """The release's plain form of ``kind`` (the weights line with mem usage, the Mamba line without
    the speculative-decoding caches)."""
    forms = F.forms_of(kind, release)
    if kind == "weights":
        forms = tuple(f for f in forms if any(fl.name == "mem_usage" for fl, _ in f.fields))
    if kind == "mamba":
        forms = tuple(sorted(forms, key=lambda f: len(f.fields)))
    return forms[0]


# ---- the example files of examples/logs/ ------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "logs"
EXAMPLE_MODEL = "examples/models/Kimi-Linear-48B-A3B"
EXAMPLE_WEIGHTS = (23.41, 23.38, 22.97, 22.95)
"""What each GPU's weights took in the example start (GiB): Kimi-Linear-48B at pp 2 x tp 2, the first
stage holding the embedding, the last the head."""


def example_files() -> dict[str, str]:
    """examples/logs/: a preflight's report and the server's logs of one deployment (Kimi-Linear-48B-A3B,
    pp 2 x tp 2 on two nodes of 2 GPUs, --mem-fraction-static 0.85, 139 GiB free, the weights taken from
    an earlier start's log), and node 1's log of a start that sized its pools smaller."""
    budget = BudgetSource(
        from_device=True,
        mem_fraction_static=0.85,
        device_free_gib=(139.0,),
        weights_gib=EXAMPLE_WEIGHTS,
        weights_source="--weights-from-log node0.log, node1.log",
    )
    report = preflight_report(
        4,
        sizing={"tp_size": 2, "mamba_full_memory_ratio": 0.9},
        budget=budget,
        per_node=2,
        model=ModelChoice(model_config=EXAMPLE_MODEL),
        host="gpu-node-",
    )
    ranks = report["ranks"]
    free = 139.0  # what the server finds before its weights: the free memory the preflight measured
    log = ServerLog(report, weights_gib=EXAMPLE_WEIGHTS.__getitem__, free_gib=free)
    smaller = {
        r: {
            "max_mamba_cache_size": ranks[r]["max_mamba_cache_size"] * 2 // 3,
            "max_running_requests": ranks[r]["max_running_requests"] * 2 // 3,
        }
        for r in (2, 3)
    }
    other = ServerLog(report, weights_gib=EXAMPLE_WEIGHTS.__getitem__, override=smaller, free_gib=free)
    start = 1_767_261_600.0  # 2026-01-01 10:00:00 UTC

    def node(server: ServerLog, n: int) -> str:
        args = f"model_path='{EXAMPLE_MODEL}', pp_size=2, tp_size=2, mem_fraction_static=0.85, nnodes=2, "
        lines = [F.render_line("0.5.23", f"server_args=ServerArgs({args}node_rank={n}, ...)", created=start)]
        lines += [
            line for rank in ranks if rank["rank"] // 2 == n for line in server.lines(rank, created=start + 9)
        ]
        if n == 0:
            lines.append(
                F.render_line("0.5.23", "The server is fired up and ready to roll!", created=start + 62)
            )
        return "\n".join(lines) + "\n"

    return {
        "preflight.json": json.dumps(report, indent=2) + "\n",
        "node0.log": node(log, 0),
        "node1.log": node(log, 1),
        "other-node1.log": node(other, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """``python tests/postflight_logs.py`` (scripts/regenerate.py runs it): rewrite examples/logs/."""
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for name, text in example_files().items():
        (EXAMPLES / name).write_text(text)
        print(f"wrote {EXAMPLES / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
