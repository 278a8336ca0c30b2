"""Every field of the status file (`NodeStatus`) says what it means: a docstring in node/peer/node_status.py, and a row
in docs/OPERATING.md's "The status file" table."""

import ast
import dataclasses
from pathlib import Path

from pathswarm.node.peer.node_status import NodeStatus

ROOT = Path(__file__).resolve().parents[2]


def documented_fields() -> dict[str, str]:
    tree = ast.parse((ROOT / "node" / "peer" / "node_status.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NodeStatus")
    out = {}
    for i, st in enumerate(cls.body):
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            nxt = cls.body[i + 1] if i + 1 < len(cls.body) else None
            doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
            out[st.target.id] = doc
    return out


def test_every_status_field_has_a_docstring_and_a_row_in_the_operators_guide():
    fields = {f.name for f in dataclasses.fields(NodeStatus)}
    docs = documented_fields()
    assert set(docs) == fields
    assert [name for name, doc in docs.items() if len(doc.strip()) < 10] == []
    guide = (ROOT / "docs" / "OPERATING.md").read_text()
    table = guide.split("## The status file", 1)[1].split("\n## ", 1)[0]
    assert [name for name in fields if f"| `{name}` |" not in table] == []
