"""Property: the text prefilter that spares most files of a tree any rule work never drops one a rule would read.

:func:`cudagraph.migrate.rules.rule_prefilter` tests a few anchors before any rule's own test. It must keep:

- every text holding any legacy spelling the rename table gives (module paths, qualified names, names, option names
  in both forms, flags), wherever it stands in the text;
- every text holding any text a rule's own test looks for (its triggers, and the last part of a legacy module that
  a relative import names), so every file :meth:`Rule.applies` to, whatever its path;

and the inventory, which reads every file whatever the prefilter says, finds a spelling split between adjacent or
``+``-joined literals (its own test joins them first).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cudagraph.migrate.inventory import FileKind, inventory
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import RULES, rule_prefilter
from cudagraph.migrate.source_migration import migrate_source
from cudagraph.migrate.spellings import legacy_spellings

TABLE = load_renames()
PREFILTER = rule_prefilter(tuple(RULES), TABLE)
SPELLINGS = sorted(spelling.text for spelling in legacy_spellings(TABLE) if not spelling.still_shipped)
"""Every legacy spelling of the table (a still-shipped module's count only beside a retired one's)."""
ALL_SPELLINGS = sorted(spelling.text for spelling in legacy_spellings(TABLE))
LOOKED_FOR = sorted(
    {text for rule in RULES for text in (*rule.triggers(TABLE), *rule.command.prefilter_texts(TABLE))}
    | {module.rpartition(".")[0] for module in TABLE.modules}
)
"""Every text a rule's own test looks for, and the packages of the legacy modules (``from package import module``)."""
FILLER = st.text(st.sampled_from("abc_xyz.-=:'\"()[]{} \n\t#+,0123456789ABC"), max_size=40)
PATHS = st.sampled_from(
    (
        "project/module.py",
        "sglang/srt/model_executor/runner.py",
        "vendor/sglang/srt/layers/attention.py",
        "cudagraph/plugins/runner.py",
        "pymllm/executor/runner.py",
    )
)
CONTEXTS = (
    "{s}",
    "x = {s}\n",
    "receiver.{s}(1)\n",
    "from {s} import Name\n",
    "from . import {s}\n",
    "from .{s} import Name\n",
    'argv = ["{s}", "8"]\n',
    "launch({s}=1)\n",
    'text = f"{{value.{s}}}"\n',
    "# {s}\n",
    "{s}: 64\n",
    "exec python -m sglang.launch_server {s} 8\n",
)


@given(before=FILLER, spelling=st.sampled_from(ALL_SPELLINGS), context=st.sampled_from(CONTEXTS), after=FILLER)
def test_a_text_holding_a_legacy_spelling_is_kept(before: str, spelling: str, context: str, after: str) -> None:
    assert PREFILTER.keeps(before + context.replace("{s}", spelling) + after)


@given(
    pieces=st.lists(st.one_of(st.sampled_from(LOOKED_FOR), st.sampled_from(SPELLINGS), FILLER), max_size=6),
    cuts=st.lists(st.integers(0, 60), max_size=3),
    path=PATHS,
)
def test_every_text_a_rule_applies_to_is_kept(pieces: list[str], cuts: list[int], path: str) -> None:
    text = "".join(pieces)
    for cut in cuts:  # pieces cut short: most no longer hold what a rule looks for, some still do
        text = text[:cut] + text[cut + 3 :]
    applying = [rule.code for rule in RULES if rule.applies(text, path, TABLE)]
    assert PREFILTER.keeps(text) or not applying, applying


@given(
    spelling=st.sampled_from(SPELLINGS),
    cut=st.integers(1, 1000),
    joint=st.sampled_from(('" "', '"\n    "', '" + "', "' '")),
    quote=st.sampled_from(('"', "'")),
)
def test_a_spelling_split_between_literals_is_still_inventoried(
    spelling: str, cut: int, joint: str, quote: str
) -> None:
    cut = 1 + cut % (len(spelling) - 1)
    joint = joint.replace('"', quote) if quote == "'" else joint.replace("'", '"')
    text = f"value = ({quote}{spelling[:cut]}{joint}{spelling[cut:]}{quote})\n"
    found = [item.spelling.text for item in inventory(text, FileKind.PYTHON, legacy_spellings(TABLE))]
    assert spelling in found


def test_a_relative_import_of_a_legacy_module_reaches_the_rules() -> None:
    """The one rule test that reads the path: ``from .cuda_graph_runner import ...`` inside a ``sglang`` folder."""
    source = "from .cuda_graph_runner import CudaGraphRunner\n\nrunner = CudaGraphRunner(model_runner)\n"
    assert PREFILTER.keeps(source)
    result = migrate_source(source, "vendor/sglang/srt/model_executor/model_runner.py", RULES, TABLE)
    assert result.parsed and result.changed
    assert b"DecodeCudaGraphRunner" in result.migrated


def test_a_file_naming_nothing_legacy_is_dropped() -> None:
    """The prefilter is worth having: ordinary code holds no anchor, and no rule reads it."""
    source = "import math\n\n\ndef scale(values, factor=2.0):\n    return [math.fabs(v) * factor for v in values]\n"
    assert not PREFILTER.keeps(source)
    assert not migrate_source(source, "project/util.py", RULES, TABLE).parsed
