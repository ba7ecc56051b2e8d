"""scripts/modmap.py finds the import circles of a crate (issue #34)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("modmap", ROOT / "scripts" / "modmap.py")
modmap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(modmap)


def crate(tmp_path, files):
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return modmap.uses(modmap.modules(src))


def test_a_circle_through_a_third_module_and_grouped_imports(tmp_path):
    g = crate(tmp_path, {
        "lib.rs": "pub mod a; pub mod b; pub mod c; pub mod d;",
        "a.rs": "use crate::{b::X, d};\n",
        "b.rs": "fn f() { crate::c::g() }\n",
        "c.rs": "use crate::a::Y;\n",
        "d.rs": "// crate::a in a comment still counts: a reader sees it too\n#[cfg(test)]\nmod tests { use crate::b; }\n",
    })
    assert g == {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert modmap.circles(g) == [{"a", "b", "c", "d"}]


def test_no_circle_and_layers(tmp_path):
    g = crate(tmp_path, {
        "lib.rs": "",
        "core.rs": "",
        "mid.rs": "use crate::core;\n",
        "mid/sub.rs": "use crate::core::Z; use super::W;\n",
        "top.rs": "use crate::{mid, core};\n",
    })
    assert modmap.circles(g) == []
    assert modmap.layers(g, []) == [["core"], ["mid"], ["top"]]


def test_the_tree_has_no_circle_but_the_known_ones():
    assert modmap.main([]) == 0
