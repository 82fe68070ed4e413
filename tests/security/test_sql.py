"""Issue 35, finding 1: the admin /sql endpoint of a running stack refuses the `$` bypasses.

The admin token's holder posted `SELECT 1 AS a$$, file('<path>','RawBLOB'), 2 AS b$$` and got the
file (DATA_DIR/secrets/mask-local.key: then forge caller assertions, decrypt restore tokens), and
`SELECT 'x' AS a$$ INTO OUTFILE '<path>' -- b$$` created a file. Each is now a clean 400 with a
message; nothing is read or written, and the gateway keeps answering.
"""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.integration

# @KEY@: the stack's own mask key file; @OUT@: a path that must not come to exist
ATTEMPTS = [
    ("issue 35 read", "SELECT 1 AS a$$, file('@KEY@','RawBLOB'), 2 AS b$$", "file() reaches outside"),
    ("issue 35 write", "SELECT 'x' AS a$$ INTO OUTFILE '@OUT@' -- b$$", "INTO OUTFILE is refused"),
    ("tagged dollar words", "SELECT 1 AS a$t$, file('@KEY@','RawBLOB'), 2 AS b$t$", "file() reaches outside"),
    ("unicode-quoted file", "SELECT \u201cfile\u201d('@KEY@', 'RawBLOB')", "file() reaches outside"),
    ("hash without space", "SELECT 1 #x\n, file('@KEY@','RawBLOB')", "file() reaches outside"),
    ("in a lambda", "SELECT arrayMap(p -> file(p, 'RawBLOB'), ['@KEY@'])", "file() reaches outside"),
    ("dollar words, second statement", "SELECT 1 AS a$$; SELECT file('@KEY@') -- $$", "only one read-only statement"),
    ("system through spaces", "SELECT * FROM SYSTEM . users", "is refused"),
]


def _post(stack, query: str) -> httpx.Response:
    return httpx.post(stack.admin_url + "/sql", json={"query": query}, timeout=60,
                      headers={"authorization": f"Bearer {stack.admin_token()}"})


@pytest.mark.parametrize("name,query,message", ATTEMPTS, ids=[a[0] for a in ATTEMPTS])
def test_sql_bypasses_are_refused(review_stack, tmp_path, name, query, message):
    key_file = review_stack.data_dir / "secrets" / "mask-local.key"
    assert key_file.is_file(), "the stack's mask key is where the exploit looked for it"
    key = key_file.read_bytes()
    written = tmp_path / "written.txt"
    r = _post(review_stack, query.replace("@KEY@", str(key_file)).replace("@OUT@", str(written)))
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert message in detail, detail
    for text in (key.decode("utf-8", "replace"), key.hex(), json.dumps(key.decode("latin-1"))[1:-1]):
        assert text not in r.text
    assert not written.exists()
    # the gateway keeps serving
    rows = review_stack.sql("SELECT count() FROM decisions")  # asserts 200
    assert len(rows) == 1 and isinstance(rows[0][0], int)
