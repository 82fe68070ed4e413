"""What an analyst's SQL may do, read the way ClickHouse reads it (issue 35).

Two readers, both must agree:
- `check_read_only(sql)`: a textual check over a faithful copy of ClickHouse's lexer
  (src/Parsers/Lexer.cpp, behaviour measured on chDB 26.9): `$` belongs to bare words (`a$$` is one
  identifier), a `$tag$` heredoc only starts where a token starts and its tag is word characters,
  `#` starts a comment only before a space or `!`, `//` and nested `/* */` are comments, `‘…’`
  and `“…”` quote. The first review's cleaner read `a$$ … b$$` as a heredoc and hid what stood
  between (issue 35, finding 1). No engine is needed: the CLI runs it before sending.
- `check_tree(lines)`: an allow-list over ClickHouse's own parse (`EXPLAIN AST` of the statement
  as ClickHouse formatted it, see `sql_gateway.analyst_query`): node types, function and table
  function names, table identifiers, and where INTO OUTFILE, FORMAT and SETTINGS hang.
"""

from __future__ import annotations

import re

_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
_FIRST_WORD = re.compile(r"^\s*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXPLAIN|EXISTS)\b", re.IGNORECASE)
# SHOW forms about the warehouse's own tables; SHOW PROCESSLIST, GRANTS, USERS, SETTINGS, ACCESS,
# CLUSTERS... are about the server and other users, and are refused
_SHOW_ALLOWED = re.compile(
    r"^\s*SHOW\s+(?:(?:(?:FULL\s+)?(?:TEMPORARY\s+)?TABLES|DATABASES|(?:EXTENDED\s+)?(?:FULL\s+)?(?:COLUMNS|FIELDS)"
    r"|(?:EXTENDED\s+)?(?:INDEX|INDEXES|INDICES|KEYS))\b"
    r"|CREATE\s+(?:(?:TEMPORARY\s+)?(?:TABLE|VIEW)\s+|(?!(?:USER|USERS|ROLE|ROLES|ROW|POLICY|POLICIES|QUOTA|QUOTAS"
    r"|SETTINGS|PROFILE|PROFILES|DATABASE|DICTIONARY|FUNCTION|NAMED|MASKING|TEMPORARY)\b))\w)",
    re.IGNORECASE)
# Table functions (and the scalar `file`, `catboostEvaluate`) that reach outside the warehouse:
# files, URLs, object stores, other servers and databases, programs, stdin, the calling Python
# process (chDB's python, arrowstream), and other databases of this server (merge, loop,
# mergeTreeIndex... can name `system`). readonly=1 refuses most of them, but not the scalar
# file(), merge() nor mergeTreeIndex() (measured, chDB 26.9). The complete list of chDB's
# table functions is checked against this one and ALLOWED_TABLE_FUNCTIONS in
# tests/test_sql_gateway.py, so an upgrade that adds one fails a test until it is classified.
REFUSED_FUNCTIONS = frozenset(name.lower() for name in """
    file fileCluster url urlCluster s3 s3Cluster gcs oss cosn hdfs hdfsCluster
    azureBlobStorage azureBlobStorageCluster remote remoteSecure cluster clusterAllReplicas
    executable mysql postgresql jdbc odbc sqlite mongodb redis input hive
    deltaLake deltaLakeCluster deltaLakeS3 deltaLakeAzure deltaLakeLocal deltaLakeS3Cluster deltaLakeAzureCluster
    iceberg icebergS3 icebergAzure icebergHDFS icebergLocal icebergCluster icebergS3Cluster icebergAzureCluster
    icebergHDFSCluster hudi hudiCluster paimon paimonS3 paimonAzure paimonHDFS paimonLocal
    arrowFlight arrowflight ytsaurus prometheusQuery prometheusQueryRange timeSeriesData timeSeriesMetrics
    timeSeriesTags timeSeriesSelector merge loop mergeTreeIndex mergeTreeAnalyzeIndexes mergeTreeProjection
    mergeTreePartInfo mergeTreeAnalyzeIndexesUUID mergeTreeCodecBlockCounts mergeTreeTextIndex
    timeSeriesMetricFamilies timeSeriesSamples icebergLocalCluster paimonCluster paimonAzureCluster
    paimonHDFSCluster paimonS3Cluster bigquery python arrowstream eval
    dictionary viewIfPermitted viewExplain filesystem filesystemCluster catboostEvaluate
""".split())
# The harmless table functions: generators and inline data, nothing outside the query. In the
# parsed tree a table function (FROM, JOIN, DESCRIBE) must be one of these: an allow-list
ALLOWED_TABLE_FUNCTIONS = frozenset(name.lower() for name in """
    numbers numbers_mt zeros zeros_mt generate_series generateSeries primes values SQLStandardValues null view
    format generateRandom fuzzJSON fuzzQuery
""".split())
# system.* holds other users' queries, settings, users and grants, logs: only these, which carry
# nothing but constants, stay readable (e.g. `SELECT 1 FROM system.one`)
ALLOWED_SYSTEM_TABLES = frozenset({"one", "numbers", "numbers_mt", "zeros", "zeros_mt"})
_SYSTEM_REF = re.compile(r"\b(system|information_schema)\b(\s*\.\s*(\w+))?", re.IGNORECASE)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_SETTINGS = re.compile(r"\bSETTINGS\b", re.IGNORECASE)
_OUTFILE = re.compile(r"\bOUTFILE\b", re.IGNORECASE)
_INSERT = re.compile(r"\bINSERT\s+INTO\b", re.IGNORECASE)
_IDENTIFIER_PARAM = re.compile(r"\{\s*\w+\s*:\s*Identifier\s*\}", re.IGNORECASE)

# ---- the lexer ---------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z0-9_$]*")  # a bare word: ASCII word characters and `$`
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")  # never `$` nor a quote: the boundary is all that matters
_HEREDOC = re.compile(r"\$[A-Za-z0-9_]*\$")  # the tag is word characters (measured: `$a-b$` is no tag)
_UNICODE_QUOTES = {"\u2018": ("\u2019", "'"), "\u201c": ("\u201d", '"')}  # ‘string’, “identifier”


class SqlError(RuntimeError):
    pass


def _quoted(sql: str, i: int, quote: str) -> tuple[str, int]:
    """The text of the quoted token starting at i ('…', "…", `…`: backslash escapes, doubled
    quotes) and the index after it."""
    j, text, n = i + 1, [], len(sql)
    while True:
        if j >= n:
            raise SqlError(f"unterminated {quote} quote")
        if sql[j] == "\\" and j + 1 < n:
            text.append(sql[j + 1])
            j += 2
        elif sql[j] == quote and sql.startswith(quote * 2, j):
            text.append(quote)
            j += 2
        elif sql[j] == quote:
            return "".join(text), j + 1
        else:
            text.append(sql[j])
            j += 1


def _skip_comment(sql: str, i: int) -> int | None:
    """The index after a comment starting at i, or None if none starts there."""
    if sql.startswith(("--", "//"), i) or sql.startswith(("# ", "#!"), i):
        j = sql.find("\n", i)
        return len(sql) if j < 0 else j
    if sql.startswith("/*", i):
        depth, j = 1, i + 2  # ClickHouse nests /* */ comments
        while j < len(sql) and depth:
            if sql.startswith("/*", j):
                depth, j = depth + 1, j + 2
            elif sql.startswith("*/", j):
                depth, j = depth - 1, j + 2
            else:
                j += 1
        if depth:
            raise SqlError("unterminated /* comment")
        return j
    return None


def _token(sql: str, i: int) -> tuple[str, int]:
    """What the token at i becomes in the clean text, and the index after it."""
    c = sql[i]
    if c in "'\"`":
        text, j = _quoted(sql, i, c)
        # a literal becomes '' ; an identifier its name ("system"."users" is system.users)
        return (" '' " if c == "'" else re.sub(r"\W", "_", text) or "_"), j
    if c in _UNICODE_QUOTES:
        close, kind = _UNICODE_QUOTES[c]
        j = sql.find(close, i + 1)
        if j < 0:
            raise SqlError(f"unterminated {c} quote")
        return (" '' " if kind == "'" else re.sub(r"\W", "_", sql[i + 1:j]) or "_"), j + 1
    if c == "$" and (m := _HEREDOC.match(sql, i)) and (end := sql.find(m.group(0), m.end())) >= 0:
        return " '' ", end + len(m.group(0))
    if c == "$" or c.isascii() and (c.isalpha() or c == "_"):
        j = _WORD.match(sql, i + 1).end()  # type: ignore[union-attr]
        return sql[i:j], j
    if c.isascii() and c.isdigit():
        j = _NUMBER.match(sql, i).end()  # type: ignore[union-attr]
        return sql[i:j], j
    if c == "\u2212":  # ClickHouse reads the mathematical minus as `-`
        return "-", i + 1
    # outside a literal ClickHouse reads any other non-ASCII character as whitespace or refuses
    # the query: whitespace is the reading that hides nothing
    return (c if c.isascii() else " "), i + 1


def _clean(sql: str) -> str:
    """`sql` with comments removed, string literals (heredocs too) emptied and quoted identifiers
    unquoted, token by token as ClickHouse's lexer splits it, so a quoted word cannot look like a
    keyword and a comment, a quote or a `$` cannot hide one."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        if (j := _skip_comment(sql, i)) is not None:
            out.append(" ")
        else:
            text, j = _token(sql, i)
            out.append(text)
        i = j
    return "".join(out)


def check_read_only(sql: str) -> None:
    """Refuse what an analyst's statement may not do, before ClickHouse sees it: one statement of
    SELECT/WITH/SHOW/DESCRIBE/EXPLAIN/EXISTS, no INTO OUTFILE, no SETTINGS clause, no table function
    that reaches outside the warehouse, no system.* / information_schema (but ALLOWED_SYSTEM_TABLES),
    no {name:Identifier} parameter (it could name any table). The tree check follows it."""
    clean = _clean(sql).strip()
    while clean.endswith(";"):
        clean = clean[:-1].rstrip()
    if not _FIRST_WORD.match(clean) or ";" in clean:
        raise SqlError(f"only one read-only statement ({', '.join(_STATEMENTS)}) is accepted")
    if clean[:4].upper() == "SHOW" and not _SHOW_ALLOWED.match(clean):
        raise SqlError("read-only SQL: of SHOW only TABLES, DATABASES, COLUMNS, INDEX and CREATE TABLE are accepted")
    if _OUTFILE.search(clean):  # readonly=1 does not stop it in chDB: this check does
        raise SqlError("read-only SQL: INTO OUTFILE is refused")
    if _INSERT.search(clean):  # e.g. WITH ... INSERT INTO
        raise SqlError("read-only SQL: INSERT is refused")
    if _IDENTIFIER_PARAM.search(clean):
        raise SqlError("read-only SQL: {name:Identifier} parameters are refused")
    for m in _CALL.finditer(clean):
        if m.group(1).lower() in REFUSED_FUNCTIONS:
            raise SqlError(f"read-only SQL: {m.group(1)}() reaches outside the warehouse and is refused")
    for m in _SYSTEM_REF.finditer(clean):
        _check_system(m.group(1), m.group(3))
    if _SETTINGS.search(clean):
        raise SqlError("read-only SQL: a SETTINGS clause is refused")


def _check_system(db: str, table: str | None) -> None:
    if db.lower() in ("system", "information_schema") and not (
            db.lower() == "system" and (table or "").lower() in ALLOWED_SYSTEM_TABLES):
        raise SqlError(f"read-only SQL: {db}{'.' + table if table else ''} is refused "
                       f"(of system.* only {', '.join(sorted(ALLOWED_SYSTEM_TABLES))} are readable)")


# ---- the parsed tree ---------------------------------------------------------------------------

# EXPLAIN AST's first line: the statements an analyst may run (SHOW's kind is not in the tree:
# check_read_only's SHOW rule, run on ClickHouse's formatting of the statement, decides it)
_ROOTS = frozenset({"SelectWithUnionQuery", "Explain", "DescribeQuery", "ShowTables", "ShowColumns", "ShowIndexes",
                    "ShowCreateTableQuery", "ShowCreateViewQuery", "ExistsTableQuery", "ExistsViewQuery"})
# every other node a read-only query may hold; anything else (and a future node type) is refused
_NODES = _ROOTS | frozenset("""
    ExpressionList SelectQuery SelectIntersectExceptQuery Subquery WithElement Literal Function Identifier
    TableIdentifier Asterisk QualifiedAsterisk ColumnsRegexpMatcher ColumnsListMatcher QualifiedColumnsRegexpMatcher
    QualifiedColumnsListMatcher ColumnsTransformerList ColumnsExceptTransformer ColumnsReplaceTransformer
    ColumnsReplaceTransformer::Replacement ColumnsApplyTransformer TablesInSelectQuery TablesInSelectQueryElement
    TableExpression TableJoin ArrayJoin SampleRatio OrderByElement WindowDefinition WindowListElement
    InterpolateElement
""".split())
_LINE = re.compile(r"( *)([A-Za-z_][A-Za-z_:]*)(?: (.*))?", re.DOTALL)
_QUERY_HOLDERS = _ROOTS | {"SelectWithUnionQuery"}  # where INTO OUTFILE, FORMAT and SETTINGS hang
_FORMAT = "Native"  # what clickhouse-connect appends: the gateway answers rows, not a format


def check_tree(lines: list[str], statement: str) -> None:
    """Refuse a statement (as ClickHouse formatted it) whose parsed tree (EXPLAIN AST's lines)
    holds anything but read-only nodes. An alias or identifier with a newline prints as extra
    lines: those can only add refusals, never hide a node, since each real node keeps its own
    line and indentation. SHOW's kind and database are not in the tree: its text decides them."""
    if not lines:
        raise SqlError("read-only SQL: ClickHouse returned no parse of the statement")
    if lines[0].startswith("Show"):
        check_read_only(statement)
    ancestors: list[str] = []
    for i, line in enumerate(lines):
        m = _LINE.fullmatch(line)
        depth = len(m.group(1)) if m else -1
        if m is None or (depth == 0) != (i == 0) or depth > len(ancestors):
            raise SqlError("only one read-only statement is accepted (ClickHouse's parse of it was not understood)")
        del ancestors[depth:]
        _check_node(m.group(2), m.group(3) or "", ancestors[-1] if ancestors else None)
        ancestors.append(m.group(2))


def _check_node(kind: str, text: str, parent: str | None) -> None:
    name = text.split(" ", 1)[0]
    if parent is None and kind not in _ROOTS:
        raise SqlError(f"only one read-only statement ({', '.join(_STATEMENTS)}) is accepted")
    if kind == "Set":
        raise SqlError("read-only SQL: a SETTINGS clause is refused")
    if kind not in _NODES:
        raise SqlError(f"read-only SQL: {kind} is not accepted in a read-only statement")
    if kind == "Function" and name.lower() in REFUSED_FUNCTIONS:
        raise SqlError(f"read-only SQL: {name}() reaches outside the warehouse and is refused")
    if kind == "Function" and parent == "TableExpression" and name.lower() not in ALLOWED_TABLE_FUNCTIONS:
        raise SqlError(f"read-only SQL: the table function {name}() is refused "
                       f"(accepted: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})")
    if kind in ("Identifier", "TableIdentifier"):
        db, _, rest = name.partition(".")
        _check_system(db, rest.split(".", 1)[0] or None)
    if parent in _QUERY_HOLDERS and kind == "Literal":  # SELECT ... INTO OUTFILE 'path' [COMPRESSION 'x']
        raise SqlError("read-only SQL: INTO OUTFILE is refused")
    if parent in _QUERY_HOLDERS and kind == "Identifier" and name != _FORMAT and parent != "ShowTables" \
            and not parent.startswith(("ShowCreate", "Exists")):
        raise SqlError("read-only SQL: a FORMAT clause is refused (the gateway answers rows)")
