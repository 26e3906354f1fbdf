"""Which model families an old release gives a state pool, as its own model_runner.py decides it.

SGLang 0.5.3.post1 is the first release with ``mambaish_config`` (``model_runner.py:1314-1330``:
``mamba2_config``, i.e. FalconH1Config | NemotronHConfig, or ``hybrid_gdn_config``, Qwen3NextConfig): its
``ModelRunner.__init__`` (:358-368) forces the radix cache off for all three and sizes a fixed pool of
--max-mamba-cache-size, else --max-running-requests, else 512 slots, divided by the attention-dp size for
hybrid GDN only (:369-377). 0.5.2 and 0.5.3 key the same block on ``is_hybrid_gdn``, a list of
architectures: Qwen3-Next only in 0.5.2 (``model_runner.py:1135-1140``), Qwen3-Next and
``FalconH1ForCausalLM`` in 0.5.3 (``:1300-1306``), so 0.5.3 already sizes Falcon-H1 (and splits its pool
over dp, as it does Qwen3-Next's); Nemotron-H has no class before 0.5.3.post1. A user relies on the
checker deriving what the release derives for these families, and on it refusing what the release has no
pool for.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.core.releases.releases import MODELLED_RELEASES, rule_value
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.families import FAMILY_TABLE
from checker.families.geometry import load_geometry

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SRC = Path(os.environ.get("CHECKER_SGLANG_SRC", Path.home() / ".cache" / "pp-checker" / "src"))
GIB = 2**30


def _derive(version: str, fixture: str, budget: float, **kw: object) -> list:
    geometry = load_geometry(model_config=FIXTURES / f"{fixture}.json", tp_size=1)
    inputs = CapacityInputs(geometry=geometry, budget_gib=budget, sglang_version=version, **kw)  # type: ignore[arg-type]
    return derive_all(inputs)


def test_falcon_h1_on_0_5_3_post1_is_the_fixed_pool_of_512_slots() -> None:
    """Falcon-H1-0.5B (36 layers, every one Mamba2 and attention), 20 GiB, pp 1, tp 1, no flags.

    configs/falcon_h1.py:304-314 ``mamba2_cache_params``: conv (1536 + 2 * 1 * 128, 4 - 1) bf16 = 10,752 B,
    temporal (24, 64, 128) fp32 = 786,432 B; x 36 layers = 28,698,624 B per request. model_runner.py:358-368:
    radix cache off, ``max_mamba_cache_size = 512``; ``profile_max_num_token`` (:1260-1311):
    rest = 20 - 512 * 28,698,624 / 2**30 GiB; cell = 2 KV heads * 64 * 36 layers (``full_attention_layer_ids``
    = range(36)) * 2 * 2 B = 18,432; ``int(rest * 2**30 // 18,432)`` = 6,781,140,992 // 18,432 = 367,900.
    ``init_memory_pool`` (:1455-1466): min(clamp(int(367,900 / 16,384 * 512), 2048, 4096), 512) = 512;
    managers/tp_worker.py:139-147: min(367,900 // 2, 512) = 512; micro max(512 // 1, 1) = 512."""
    (s,) = _derive("0.5.3.post1", "falcon_h1_0_5b", 20.0)
    assert s.per_req_bytes == 28_698_624 and s.kv_cell_bytes == 18_432
    assert (s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size) == (512, 512, 512)
    assert s.slots_per_request == 1  # the radix cache is forced off
    assert s.max_total_num_tokens == (20 * GIB - 512 * 28_698_624) // 18_432 == 367_900
    assert s.kv_budget_gib == 20 - 512 * 28_698_624 / GIB


def test_nemotron_h_on_0_5_3_post1_takes_max_running_requests_as_its_pool() -> None:
    """Nemotron-H-8B (52 layers: 24 'M', 4 '*'), 8 GiB, --max-running-requests 16, pp 1, tp 1.

    configs/nemotron_h.py:275-286: conv (128 * 64 + 2 * 8 * 128, 4 - 1) bf16 = 61,440 B, temporal
    (128, 64, 128) fp32 = 4,194,304 B; x 24 'M' layers = 102,137,856 B. model_runner.py:362-366:
    ``max_mamba_cache_size = max_running_requests`` = 16 (no // dp: :369 is hybrid GDN only).
    ``profile_max_num_token``: cell = 8 KV heads * 128 * 4 '*' layers * 2 * 2 B = 16,384; rest =
    8 * 2**30 - 16 * 102,137,856 = 6,955,728,896 B, // 16,384 = 424,544 tokens. ``init_memory_pool``:
    min(16, 16) = 16; tp_worker.py: min(16 // 1, 16) = 16; micro 16."""
    (s,) = _derive("0.5.3.post1", "nemotron_h_8b", 8.0, max_running_requests=16)
    assert s.per_req_bytes == 102_137_856 and s.kv_cell_bytes == 16_384
    assert (s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size) == (16, 16, 16)
    assert s.slots_per_request == 1 and s.max_total_num_tokens == 424_544 and s.context_len == 8192
    # Without --max-running-requests the pool is 512 slots: 512 * 102,137,856 B = 48.7 GiB > 8.
    with pytest.raises(Exception, match="leaves .* GiB of --budget-gib 8.0 for the KV cache"):
        _derive("0.5.3.post1", "nemotron_h_8b", 8.0)


@pytest.mark.parametrize(
    ("version", "pool"),
    [
        # 0.5.3 model_runner.py:357-374: the is_hybrid_gdn block, FalconH1ForCausalLM included, // dp.
        ("0.5.3", 64 // 2),
        # 0.5.3.post1 :369-377: // dp for hybrid_gdn_config (Qwen3NextConfig) only.
        ("0.5.3.post1", 64),
        # 0.5.3.post2 handle_max_mamba_cache: the same (``if self.hybrid_gdn_config is not None``).
        ("0.5.3.post2", 64),
    ],
)
def test_attention_dp_splits_falcon_h1s_pool_only_where_the_release_says(version: str, pool: int) -> None:
    """--max-running-requests 64 at attention dp 2, radix off: K = 64 // 2 on 0.5.3 (is_hybrid_gdn), 64
    from 0.5.3.post1 (mamba2_config is not split)."""
    stages = _derive(
        version, "falcon_h1_0_5b", 20.0, max_running_requests=64, dp_size=2, disable_radix_cache=True
    )
    assert {s.max_mamba_cache_size for s in stages} == {pool}


def test_nemotron_h_and_falcon_h1_are_refused_where_the_release_has_no_pool_for_them() -> None:
    """A model spec naming the family (no class to look up): 0.5.2 sizes Qwen3-Next only, 0.5.3 has no
    pool for Nemotron-H (no NemotronHConfig, not in is_hybrid_gdn); both derive on 0.5.3.post1."""
    nemotron = load_geometry(model_config=FIXTURES / "nemotron_h_8b.json")
    falcon = load_geometry(model_config=FIXTURES / "falcon_h1_0_5b.json")
    for version, geometry in (("0.5.2", nemotron), ("0.5.2", falcon), ("0.5.3", nemotron)):
        with pytest.raises(FlagError, match=f"SGLang {version} sizes a mamba state pool only for model_type"):
            derive_all(CapacityInputs(geometry=geometry, budget_gib=80.0, sglang_version=version))
    for geometry in (nemotron, falcon):
        assert derive_all(CapacityInputs(geometry=geometry, budget_gib=80.0, sglang_version="0.5.3.post1"))


# -- the rule read again from each release's model_runner.py ---------------------------------------------

CONFIG_CLASSES = {
    "Qwen3NextConfig": "qwen3_next",
    "FalconH1Config": "falcon_h1",
    "NemotronHConfig": "nemotron_h",
}
ARCHITECTURES = {"Qwen3NextForCausalLM": "qwen3_next", "FalconH1ForCausalLM": "falcon_h1"}


def _families_in(source: str) -> tuple[set[str], set[str] | None]:
    """(families with a pool, families whose pool is split over dp; None: all of them) as the runner's
    ``is_hybrid_gdn`` list or its ``hybrid_gdn_config`` / ``mamba2_config`` isinstance checks say."""
    tree = ast.parse(source)
    props = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    if "is_hybrid_gdn" in props:
        names = {c.value for c in ast.walk(props["is_hybrid_gdn"]) if isinstance(c, ast.Constant)}
        return {ARCHITECTURES[a] for a in names if a in ARCHITECTURES}, None

    def classes(prop: str) -> set[str]:
        found = {n.id for n in ast.walk(props[prop]) if isinstance(n, ast.Name) and n.id in CONFIG_CLASSES}
        return {CONFIG_CLASSES[c] for c in found}

    gdn = classes("hybrid_gdn_config")
    return gdn | (classes("mamba2_config") if "mamba2_config" in props else set()), gdn


@pytest.mark.parametrize("version", ["0.5.2", "0.5.3", "0.5.3.post1", "0.5.3.post2"])
def test_the_pool_families_are_what_the_releases_model_runner_says(version: str) -> None:
    path = SRC / version / "sglang" / "srt" / "model_executor" / "model_runner.py"
    if not path.is_file():
        pytest.skip(f"no unpacked SGLang {version} under {SRC}")
    pool, split = _families_in(path.read_text())
    pools = rule_value(version, "pool_families", FAMILY_TABLE)
    splits = rule_value(version, "dp_split_families", FAMILY_TABLE)
    assert isinstance(pools, tuple) and set(pools) == pool
    assert (None if splits is None else set(splits)) == split  # type: ignore[arg-type]
    assert version in MODELLED_RELEASES
