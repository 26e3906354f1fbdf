"""A separate EAGLE-2 draft (``--speculative-algorithm EAGLE`` with ``--speculative-draft-model-path`` whose
config.json names ``LlamaForCausalLMEagle`` or ``Qwen2ForCausalLMEagle``), issue 39 item 3.

The classes as built are held to SGLang's own on the meta device in tests/test_weights.py (cases
``eagle2/*`` on 0.5.10, 0.5.20 and 0.5.23); here: what the figure holds of the draft's
embedding and head (``set_embed_and_head`` frees them after the pool is sized from 0.5.14), on which ranks,
from which release, the refusals, and the draft's shards held to its class. Draft directories hold
config.json (and, where shards are held, sparse safetensors of the class's real shapes).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import ConfigError, FlagError
from checker.core.weights.weights import WeightsLayout, allocator_bytes
from checker.families.drafts import check_draft_checkpoint, eagle2_tensors, separate_draft_params
from checker.families.rules import model_weights
from tests.checkpoints import Spec, write_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3_NEXT = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
SMALL = dict(QWEN3_NEXT, num_hidden_layers=4, num_experts=16, num_experts_per_tok=4)
NEMOTRON_H = json.loads((FIXTURES / "weights/nemotron_h_8b.json").read_text())
LLAMA = json.loads((FIXTURES / "weights/eagle2_llama3_8b_draft.json").read_text())
# an EAGLE-2 head for the Qwen3-Next target: its hidden size and vocabulary
DRAFT = dict(LLAMA, hidden_size=2048, num_attention_heads=16, num_key_value_heads=4, intermediate_size=8192,
             vocab_size=151936, torch_dtype="bfloat16")  # fmt: skip
V = ["--sglang-version", "0.5.23"]


def _dir(path: Path, config: dict[str, Any], tensors: list[Spec] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        write_checkpoint(path, tensors, shards=1)
    return path


def _layout(path: Path, **kw: Any) -> WeightsLayout:
    return WeightsLayout(draft="separate", draft_path=str(path), draft_algorithm="EAGLE", **kw)


def _ranks(draft: Path, release: str = "0.5.23", **kw: Any) -> list[Any]:
    layout = _layout(draft, **{"pp_size": 1, "tp_size": 2, **kw})
    return list(model_weights(SMALL, layout, release=release).ranks)


@pytest.mark.parametrize("release", ["0.5.14", "0.5.19", "0.5.23"])
def test_the_figure_holds_the_drafts_embedding_and_head_freed_after_the_pool(
    tmp_path: Path, release: str
) -> None:
    """set_embed_and_head (llama.py:895-905) deletes the draft's own embedding and head, but from 0.5.14
    its worker calls it in alloc_memory_pool (eagle_worker_v2.py:231/213/258), after
    init_target_memory_pool measured the free memory (scheduler.py:1098-1111): the figure is the class as
    built, embedding and head included (sgl-project/sglang#36452)."""
    d = _dir(tmp_path / "d", DRAFT)
    layout = _layout(d, pp_size=1, tp_size=2)
    ranks = _ranks(d, release=release)
    params = separate_draft_params(DRAFT, layout, ranks[0].place, release=release, source="config.json")
    assert params is not None and not [p for p in params if p.part == "dropped"]
    assert [r.draft_bytes for r in ranks] == [allocator_bytes([p.nbytes for p in params])] * 2
    # the vocabulary rows it holds as the pool is sized: 2 x 151936/2 x 2048 x 2 bytes, about 1.16 GiB
    names = {p.name for p in params}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= names
    rows = sum(p.nbytes for p in params if p.name in ("model.embed_tokens.weight", "lm_head.weight"))
    assert rows == 2 * 75968 * 2048 * 2


def test_before_0_5_14_the_copies_go_in_the_workers_constructor(tmp_path: Path) -> None:
    """0.5.13: init_lm_head runs in EagleDraftWorker.__init__ (eagle_worker_v2.py:198), so the draft holds
    neither copy once built; the draft is loaded after the pool is sized, so it is charged nothing."""
    d = _dir(tmp_path / "d", DRAFT)
    layout = _layout(d, pp_size=1, tp_size=2)
    ranks = _ranks(d, release="0.5.13")
    params = separate_draft_params(DRAFT, layout, ranks[0].place, release="0.5.13", source="config.json")
    assert params is not None
    assert {p.name for p in params if p.part == "dropped"} == {"model.embed_tokens.weight", "lm_head.weight"}
    assert [r.draft_bytes for r in ranks] == [0, 0]


def test_under_pp_the_last_stage_holds_the_draft_as_built(tmp_path: Path) -> None:
    """0.5.21+ with SGLANG_ENABLE_PP_SPEC: only the last stage loads the draft; it keeps its own embedding
    (pp_draft_embedding.py:225-248) and its head is freed after the pool: the class as built, and the same
    bytes as at pp 1 with the same TP."""
    d = _dir(tmp_path / "d", DRAFT)
    layout = _layout(d, pp_size=2, tp_size=1)
    ranks = model_weights(NEMOTRON_H, layout, release="0.5.23").ranks  # Qwen3-Next asserts one stage
    assert ranks[0].draft_bytes == 0 and ranks[1].draft_bytes > 0
    params = separate_draft_params(DRAFT, layout, ranks[1].place, release="0.5.23", source="config.json")
    assert params is not None and not [p for p in params if p.part == "dropped"]
    assert ranks[1].draft_bytes == allocator_bytes([p.nbytes for p in params])
    assert ranks[1].draft_bytes == _ranks(d, tp_size=1)[0].draft_bytes


@pytest.mark.parametrize("release, charged", [("0.5.13", False), ("0.5.14", True)])
def test_charged_from_the_release_that_loads_the_draft_before_the_pool(
    tmp_path: Path, release: str, charged: bool
) -> None:
    d = _dir(tmp_path / "d", DRAFT)
    assert all((r.draft_bytes > 0) == charged for r in _ranks(d, release=release))


@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_a_tied_eagle2_draft_is_what_every_release_fails_on(
    tmp_path: Path, release: str, cli: Callable[..., Any]
) -> None:
    """Tied, lm_head is the embedding module: set_embed_and_head deletes its one weight twice
    (llama.py:896-897): AttributeError at start. One line, exit 2, with a figure read or given."""
    target = _dir(tmp_path / "t", SMALL)
    draft = _dir(tmp_path / "d", dict(DRAFT, tie_word_embeddings=True))
    launch = ["--model-path", str(target), "--tp-size", "2", "--mem-fraction-static", "0.85",
              "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(draft)]  # fmt: skip
    for weights in ([], ["--weights-gib", "20"]):
        code, out, err = cli(["derive", "--gpu-free-gib", "139", *weights, "--sglang-version", release,
                              "--", *launch])  # fmt: skip
        assert code == 2 and out == "", err
        assert "\n" not in err.strip() and "deletes that one weight twice" in err and release in err


def test_an_eagle2_draft_under_eagle3_or_attention_dp_is_refused_in_one_line(tmp_path: Path) -> None:
    d = _dir(tmp_path / "d", DRAFT)
    for layout in (
        dataclasses.replace(_layout(d, pp_size=1, tp_size=2), draft_algorithm="EAGLE3"),
        _layout(d, pp_size=1, tp_size=2, dp_size=2),
    ):
        with pytest.raises(FlagError) as exc:
            model_weights(SMALL, layout, release="0.5.23")
        assert "LlamaForCausalLMEagle" in str(exc.value) and "\n" not in str(exc.value)


def _shards() -> list[Spec]:
    return [(n, s, "BF16") for n, s in eagle2_tensors(DRAFT, "LlamaForCausalLMEagle", "config.json")]


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda t: [x for x in t if x[0] != "fc.bias"], "tensor 'fc.bias' is in no shard"),
        (lambda t: [("model." + n, s, d) for n, s, d in t], "tensor 'fc.weight' is in no shard"),
        (lambda t: [(n, (s[0], s[1] // 2) if n == "fc.weight" else s, d) for n, s, d in t], "[2048, 2048]"),
    ],
    ids=["no-fc-bias", "model-prefixed", "fc-shape"],
)
def test_the_drafts_shards_are_held_to_its_class(
    tmp_path: Path, change: Callable[[list[Spec]], list[Spec]], words: str
) -> None:
    """LlamaForCausalLMEagle.load_weights puts 'model.' before each name (llama_eagle.py:144-148) and the
    target's loader skips a name it has no parameter for with a warning: a 'model.'-prefixed checkpoint,
    or one without fc.bias, leaves parameters on uninitialised memory. The embedding and head need not be
    there (the target's are bound)."""
    check_draft_checkpoint(str(_dir(tmp_path / "whole", DRAFT, _shards())), release="0.5.23")
    with pytest.raises(ConfigError) as exc:
        check_draft_checkpoint(str(_dir(tmp_path / "bad", DRAFT, change(_shards()))), release="0.5.23")
    assert words in str(exc.value) and "LlamaForCausalLMEagle" in str(exc.value)


def test_derive_charges_the_eagle2_draft_on_every_rank(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """derive's JSON carries each rank's draft bytes (fc and layers, the shared embedding and head not),
    and the text names the draft in the budget line."""
    target = _dir(tmp_path / "t", SMALL)
    draft = _dir(tmp_path / "d", DRAFT)
    launch = ["--model-path", str(target), "--tp-size", "2", "--mem-fraction-static", "0.85",
              "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(draft)]  # fmt: skip
    code, out, err = cli(["derive", "--gpu-free-gib", "139", "--format", "json", *V, "--", *launch])
    assert code == 0, err
    per_rank = json.loads(out)["weights"]["per_rank"]
    assert [r["draft_bytes"] for r in per_rank] == [r.draft_bytes for r in _ranks(draft)]
    code, out, err = cli(["derive", "--gpu-free-gib", "139", *V, "--", *launch])
    assert code == 0, err
    drafted = _ranks(draft)[0].draft_bytes / 2**30
    assert f"of which the speculative draft {drafted:.2f} GiB from config)" in out
