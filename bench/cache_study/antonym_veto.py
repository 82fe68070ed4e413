"""E4: E3 plus an antonym-pair feature and veto (a general bilingual list, written without reading any pair)."""
import os
from pathlib import Path

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")
import re
import sys

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embedding_pairs as e1
from sklearn.ensemble import HistGradientBoostingClassifier

PAIRS = [("enable", "disable"), ("add", "remove"), ("allow", "block"), ("include", "exclude"), ("upgrade", "downgrade"),
         ("before", "after"), ("lock", "unlock"), ("open", "close"), ("start", "stop"), ("turn on", "turn off"),
         ("show", "hide"), ("install", "uninstall"), ("connect", "disconnect"), ("import", "export"), ("upload", "download"),
         ("send", "receive"), ("increase", "decrease"), ("activate", "deactivate"), ("pause", "resume"), ("mute", "unmute"),
         ("follow", "unfollow"), ("pin", "unpin"), ("link", "unlink"), ("archive", "unarchive"), ("sign in", "sign out"),
         ("log in", "log out"), ("incoming", "outgoing"), ("domestic", "international"), ("refundable", "non-refundable"),
         ("켜", "끄"), ("추가", "삭제"), ("허용", "차단"), ("포함", "제외"), ("업그레이드", "다운그레이드"), ("전", "후"),
         ("잠금", "해제"), ("열", "닫"), ("시작", "중지"), ("설치", "제거"), ("연결", "해제"), ("업로드", "다운로드"),
         ("보내", "받"), ("늘리", "줄이"), ("활성화", "비활성화"), ("로그인", "로그아웃"), ("국내", "해외"), ("입국", "출국")]
def has(t, w): return re.search(r"\b" + re.escape(w) + r"\b", t) is not None if w.isascii() else w in t
def antonym(a, b):
    a, b = a.lower(), b.lower()
    return float(any((has(a, x) and has(b, y) and not has(a, y) and not has(b, x)) or
                     (has(a, y) and has(b, x) and not has(a, x) and not has(b, y)) for x, y in PAIRS))
ce = np.load(WORK + "/ce_oof.npy")
key = {(r["a"], r["b"], r["set"]): ce[i] for i, r in enumerate(e1.rows)}
orig = e1.feat
e1.feat = lambda r, c, mode: np.append(orig(r, c, mode), [key[(r["a"], r["b"], r["set"])], antonym(r["a"], r["b"])])
dec0 = e1.decided
e1.decided = lambda r, c: dec0(r, c) or antonym(r["a"], r["b"]) == 1.0  # as a hard veto
def hgb(): return HistGradientBoostingClassifier(max_iter=300, learning_rate=0.05)
e1.run("full", hgb)
