"""The gate's word lists: negation, stop words, phrases, number words, words that pin down which thing
is meant, and the paraphrase lexicon (grown on tests/data/cache_pairs.jsonl; see bench/results/README.md,
"Semantic cache"). Data only."""

from __future__ import annotations

NEGATION_EN = {"not", "no", "never", "without", "cannot", "can't", "won't", "don't", "doesn't", "didn't",
                "isn't", "aren't", "wasn't", "shouldn't", "couldn't", "wouldn't", "exclude", "excluding", "except",
                "neither", "nor", "unable", "fail", "failed", "fails"}

# 지 마/말: the prohibitive ("삭제하지 마세요" asks the opposite of "삭제하세요")
NEGATION_KO = ("안 ", "못 ", "않", "없", "말고", "제외", "아니", "불가", "실패", "안돼", "안되", "안 돼", "못해",
               "지 마", "지마", "지 말", "지말")

# negation words counted one by one: two negations are an assertion ("there's no way I can't get
# a refund" is not "there's no way I can get a refund"; 안 바꿔도 되는 거 아니에요 / 바꿔도 되는 거 아니에요)
NEGATION_COUNT = (r"\bnot\b", r"\bno\b", r"\bnever\b", r"n't\b", r"\bcannot\b", r"(?<![가-힣])안\s", r"(?<![가-힣])못\s",
                  "않", "아니", "없")

# Where a prompt splits into clauses that can be negated apart: "works on A but not on B"
CLAUSE_BREAK = (r"[,;.!?]|\b(?:but|and|or|while|whereas|although|though|yet)\b"
                r"|(?<=[가-힣])(?:는데도|는데|지만|으나|고|며|면서)(?=\s)")

# Words that set one thing against another: the order of what stands around them is meaning
# ("to my office instead of my home" is not "to my home instead of my office", 할부 말고 일시불 is
# not 일시불 말고 할부). Matched on the lower-cased text.
ALTERNATIVE = r"\binstead of\b|\brather than\b|\bbut not\b|(?<=[가-힣])\s?(?:말고|대신에?|아니라|보다)(?=\s)"

# Relations between things, by meaning: both prompts relate, and by different ones -> another
# question ("after I started" / "before I started", "orders over $50" / "under $50", 먹기 전에 /
# 먹고 나서). A relation on one side only is rewording. Matched on the lower-cased text.
RELATIONS: dict[str, tuple[str, ...]] = {
    "before": (r"\bbefore\b", r"\bprior to\b", r"\bearlier than\b", r"(?<=[가-힣]) ?전에", "이전에", "먼저", "미리"),
    "after": (r"\bafter\b", r"\blater than\b", r"(?<=[가-힣]) ?후에", "이후", "나서", "나중에", "다음에", r"(?<=[가-힣])고 바로"),
    "with": (r"\bwith\b",),
    "without": (r"\bwithout\b", "없이"),
    "until": (r"\buntil\b", r"\btill\b"),
    "more": (r"\bover\b", r"\babove\b", r"\bmore than\b", r"\bat least\b", r"\bolder than\b", "이상", "초과"),
    "less": (r"\bunder\b", r"\bbelow\b", r"\bless than\b", r"\bat most\b", r"\byounger than\b", "이하", "미만"),
    "better": (r"\bbetter\b", r"\bimprov", "좋아지", "좋아져", "나아지", "나아져", "호전"),
    "worse": (r"\bworse\b", r"\bworsen", "나빠지", "나빠져", "심해지", "심해져", "악화"),
    "in": (r"\bopt(?:ing|ed)? in\b", r"\bopt-in\b"),
    "out": (r"\bopt(?:ing|ed)? out\b", r"\bopt-out\b"),
}

# What a prompt asks to be told: whether a thing may be done, must be done, or must not be done.
# Both prompts name one, and not the same -> another question ("may I drink water before surgery" /
# "must I drink water ...", 촬영 가능 / 촬영 금지). Plain negation is counted apart (NEGATION_COUNT).
MODALITY: dict[str, tuple[str, ...]] = {
    "may": (r"\bcan (?:i|we|you|he|she|they|my|our|the|a|an|someone|anyone|kids?|children)\b", r"\bmay i\b",
            r"\b(?:is it|are we|am i) (?:ok|okay|fine)\b", r"\ballowed\b", r"\bpermitted\b", r"\bpossible\b",
            r"\bable to\b", "가능", r"[가-힣]도 (?:돼|되|괜찮)", "수 있", "허용", "허락"),
    "must": (r"\bmust\b", r"\bhave to\b", r"\bhas to\b", r"\bneeds? to\b", r"\brequired?\b",
             r"\bmandatory\b", r"\bobligatory\b", r"\bshould\b", "필수", r"[가-힣]야 ?(?:하|해|돼|되|할|합)",
             "반드시", "의무"),
    "must_not": (r"\bnot allowed\b", r"\bprohibited\b", r"\bforbidden\b", r"\bbanned\b", r"\bmust not\b",
                 r"\bmustn't\b", "금지", "불가"),
}

# Korean prefixes that turn a noun into its opposite: 비공개 / 공개, 미결제 / 결제, 불포함 / 포함,
# 무선 / 유선 is a pair of its own (SPECIFIC_KO)
KO_OPPOSITE_PREFIX = ("비", "미", "불", "무")

# Opposites: one prompt says one side, the other the other side -> another question ("on by
# default" / "off by default", 자동 / 수동). Matched as lower-case substrings (English words as
# words); a prompt that names both sides says nothing either way.
ANTONYMS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    ((r"\bautomatic(?:ally)?\b", "자동"), (r"\bmanual(?:ly)?\b", "수동")),
    ((r"\bwired\b", r"\bcable\b", "유선"), (r"\bwireless(?:ly)?\b", r"\bwi-?fi\b", "무선")),
    ((r"\bon by default\b", r"\bturned on\b", r"\bis on\b"), (r"\boff by default\b", r"\bturned off\b", r"\bis off\b")),
    ((r"\bgo(?:es)? up\b", r"\brises?\b", r"\bincreas", "오르", "올라", "상승", "증가", "늘어"),
     (r"\bgo(?:es)? down\b", r"\bdrops?\b", r"\bdecreas", "내려", "떨어", "하락", "감소", "줄어")),
    ((r"\bmore\b", r"\bfaster\b", r"\bhigher\b", "많아", "많이", "빨리", "빠르게", "더 "),
     (r"\bless\b", r"\bfewer\b", r"\bslower\b", r"\blower\b", "적어", "적게", "느리", "덜 ")),
    ((r"\bnewest\b", r"\blatest\b", r"\bmost recent\b", "최근", "최신"), (r"\boldest\b", r"\bearliest\b", "오래된")),
    ((r"\bhighest\b", r"\bmaximum\b", r"\bmax\b", "최대", "최고"), (r"\blowest\b", r"\bminimum\b", r"\bmin\b", "최소", "최저")),
    ((r"\bmerge", "병합", "합치"), (r"\bsplit", "분리", "나누")),
    ((r"\bover(?:clock|charg|pa(?:y|id))", ), (r"\bunder(?:clock|charg|pa(?:y|id))",)),
    ((r"\bencrypt", "암호화하"), (r"\bdecrypt", "암호화 푸", "암호 해제", "암호화 해제")),
    ((r"\bearn", "적립은", "적립하", "적립이"), (r"\bredeem", r"\bspend", "사용은", "사용하", "사용이")),
    ((r"\bdeposit", "입금"), (r"\bwithdraw", "출금")),
    ((r"\bapprov", "승인"), (r"\breject", r"\bdecline", "거절", "반려")),
    ((r"\bpublic\b", "공개"), (r"\bprivate\b", "비공개")),
    ((r"\bonline\b", "온라인"), (r"\boffline\b", r"\bin store\b", r"\bin-store\b", "오프라인", "매장")),
    ((r"\btemporar", "임시", "일시"), (r"\bpermanent", "영구")),
    ((r"\bfull\b", r"\bentire\b", "전체", "전액"), (r"\bpartial", "일부", "부분")),
    ((r"\bsubscribe", "구독 신청", "수신하"), (r"\bunsubscribe", "구독 해지", "수신 거부")),
    ((r"\bsign(?:ed)? up\b", r"\bjoin", "가입"), (r"\bclose my account\b", r"\bdelete my account\b", "탈퇴")),
    ((r"\bbuy\b", r"\bbought\b", "구매", "샀"), (r"\bsell\b", r"\bsold\b", "판매", "팔")),
    ((r"\blend\b", r"\blent\b", "빌려주"), (r"\bborrow", "빌리")),
]

# Units a quantity is counted in, as hours (time) or as themselves: "3주" is not "3일", and
# "14일" is "2주", "48 hours" is "two days". Korean units follow the number directly or after a space.
TIME_UNITS_H = {"시간": 1, "일": 24, "주": 168, "주일": 168, "개월": 720, "달": 720, "년": 8760,
                "hour": 1, "hours": 1, "hr": 1, "hrs": 1, "day": 24, "days": 24, "week": 168, "weeks": 168,
                "month": 720, "months": 720, "year": 8760, "years": 8760}

# What kind of answer a question asks for. Two prompts that both ask for a kind, with no kind in
# common (when / where, how long / how much), are different questions however many words they
# share; a price or a person asked on one side only is one too ("how much to cancel" / "how to
# cancel", "who can see it" / "how can I share it"). Another kind on one side only is rewording
# ("Where can I download it?" / "How do I get it?", a complaint / "why does it ...").
# Matched on the lower-cased text; Korean 얼마 asks for any quantity.
QUESTION_KINDS: dict[str, tuple[str, ...]] = {
    "amount": (r"\bhow much\b", r"\bcosts?\b", r"\bprice\b", r"\bfees?\b", "비용", "가격", "요금", "수수료",
               "(?:배송|택배|배달|운송|반품|교환|수리|설치|교통|관리|이용|회|연회|등록|수강|진료|입장|주차)비"),
    "count": (r"\bhow many\b", r"몇\s?(?:개|명|번|장|대|권|알|정|회|잔|병|살|층|차|박|군데|가지)"),
    "duration": (r"\bhow long\b", r"며칠(?:이나)? 걸", "몇 시간"),
    "frequency": (r"\bhow often\b", "얼마나 자주", "몇 번마다"),
    "quantity": ("얼마",),
    # "when" asks a time at the start or before an auxiliary, not in "is it ok when I have a cold"
    "time": (r"^\W*when\b", r"\bwhen (?:will|would|do|does|did|is|are|was|can|could|should|shall)\b", r"\bwhat time\b", r"\bhow soon\b", "언제", r"몇\s?시(?!간)"),  # noqa: E501 - word data
    "place": (r"\bwhere\b", "어디"),
    "reason": (r"\bwhy\b", r"\bhow come\b", r"\bwhat causes\b", "왜", "이유", "원인"),
    # how to do it: the steps (a place answers it too: "where do I download it" / "how do I get it")
    "method": (r"\bhow (?:do|can|could|should|would|to|does)\b", r"\bwhat(?:'s| is) the (?:best )?way\b",
               r"\bsteps? to\b", "어떻게", "어떡", "어케", "방법", r"(?<=[가-힣])는 ?법\b", "하는 법", "절차"),
    "person": (r"\bwho\b", r"\bwhom\b", "누가", "누구"),
}
# kinds that answer each other: Korean 얼마 is how much, how long or how many
QUESTION_KIND_OVERLAP = {"quantity": {"amount", "count", "duration", "frequency"}, "method": {"place"},
                         "place": {"method"},
                         # a question word no kind names (what, which, 뭐, 어느): any kind but whether
                         "other": {"amount", "count", "duration", "frequency", "quantity", "time", "place", "reason",
                                   "person", "method"}}
# A yes/no question: it asks whether, not when, where or how much. A kind asked on one side while
# the other only asks whether is another question ("do I have to verify again after changing my
# number?" / "where do I change my number?"). English: an auxiliary first; Korean: a question with
# no question word (the kinds above, and 어떻게 / 뭐 / 무슨 / 어느 / 어떤).
YES_NO_EN = r"^\W*(?:can|could|do|does|did|is|are|was|were|will|would|should|shall|may|must|have|has|am)\b"
WH_KO = ("언제", "어디", "왜", "누가", "누구", "얼마", "몇", "며칠", "어떻게", "어떡", "어케", "뭐", "무엇", "무슨", "어느", "어떤")  # noqa: E501 - word data
WH_EN = r"\b(?:what|when|where|why|who|whom|which|how)\b"
# kinds that must be asked on both sides or neither (when the other side asks anything): a price,
# a person, a cause ("why is it charged?" / "how much is it?")
QUESTION_KINDS_BOTH = ("amount", "person", "reason")

STOP_EN = {
    "a", "an", "the", "i", "me", "my", "mine", "you", "your", "we", "our", "us", "it", "its", "is", "are", "was",
    "were", "be", "been", "am", "do", "does", "did", "to", "of", "in", "on", "at", "for", "with", "and", "or", "so",
    "how", "what", "when", "where", "why", "which", "who", "can", "could", "would", "should", "will", "shall",
    "may", "might", "must", "please", "pls", "plz", "hi", "hello", "hey", "thanks", "thank", "there", "this",
    "that", "these", "those", "if", "get", "got", "need", "want", "like", "just", "some", "any", "there's",
    "i'm", "i've", "it's", "what's", "how's", "let", "know", "tell", "help", "way", "about", "from", "by", "up",
    "into", "out", "again", "also", "ok", "okay", "kindly", "possible", "anyone", "someone", "go", "have", "has",
    "make", "able", "really", "anymore", "still", "already", "even", "exactly", "actually", "yes",
}

STOP_KO = {"어떻게", "어떡해", "좀", "제", "저", "나", "내", "혹시", "그", "이거", "저거", "뭐", "무엇", "언제",
            "어디", "왜", "안녕하세요", "감사합니다", "부탁", "부탁드립니다", "방법", "알려", "알려주세요", "궁금",
            "수", "때", "것", "거", "법", "하", "되", "있", "없", "가능", "필요", "싶", "주", "보", "알", "어떻",
            "이렇", "그렇", "어떤", "뭐뭐", "얼마나", "얼마", "이", "데", "줄", "뿐", "듯", "만큼",
            "번", "개", "원", "적", "채", "중", "등", "분", "쪽", "편", "해", "드리", "받", "알리", "주시"}

# Multi-word expressions that are one word to the gate: "turn on" is "enable" (normalised before
# analysis, so "turn on dark mode" and "enable dark mode" compare as the same verb).
PHRASES = [
    (r"\bturn(?:s|ed|ing)? on\b", "enable"), (r"\bturn(?:s|ed|ing)? off\b", "disable"),
    (r"\bswitch(?:es|ed|ing)? on\b", "enable"), (r"\bswitch(?:es|ed|ing)? off\b", "disable"),
    (r"\bsign(?:s|ed|ing)? ?up\b", "register"), (r"\bsign(?:s|ed|ing)? ?in\b", "login"),
    (r"\blog(?:s|ged|ging)? ?in(?:to)?\b", "login"), (r"\bsign(?:s|ed|ing)? ?out\b", "logout"),
    (r"\blog(?:s|ged|ging)? ?(?:me )?out\b", "logout"), (r"\bwork(?:s|ed|ing)? out\b", "exercise"),
    (r"\bpick(?:s|ed|ing)? ?up\b", "collect"), (r"\bp\.?o\.? box", "pobox"), (r"\bset ?up\b", "setup"),
    (r"\bin-?store\b", "store"),
]

KO_NATIVE = {"한": 1, "두": 2, "세": 3, "네": 4, "다섯": 5}

EN_NUMBER = {"once": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
              "twice": 2, "double": 2, "dozen": 12}

KO_UNIT = {"십": 10, "백": 100, "천": 1_000, "만": 10_000, "억": 100_000_000}

# Words that pin down *which* thing is meant: they must match exactly, never by similarity.
SPECIFIC = {
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "weekend", "weekday",
    "january", "february", "march", "april", "june", "july", "august", "september", "october", "november",
    "december", "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon", "evening", "night", "am", "pm",
    "week", "month", "year", "daily", "weekly", "monthly", "yearly", "annual",
    "enable", "disable", "include", "exclude", "add", "remove", "delete", "open", "close", "start", "stop",
    "upgrade", "downgrade", "buy", "sell", "import", "export", "upload", "download", "before", "after",
    "good", "bad", "best", "worst", "avoid", "safe", "unsafe", "email", "mail", "mailing", "postal", "billing",
    "shipping", "home", "work", "business", "personal", "first", "last", "new", "old", "next", "previous",
    "coming", "upcoming", "early", "late", "earlier", "later", "install", "uninstall", "login", "logout",
    "lock", "unlock", "send", "receive", "increase", "decrease", "raise", "lower", "more", "less",
    # tiers and options: the same question about another product or service level
    "express", "standard", "economy", "priority", "overnight", "international", "domestic", "free", "paid",
    "premium", "basic", "pro", "plus", "lite", "family", "student", "trial", "gold", "silver",
    # operations that undo or hold what the other prompt does
    "cancel", "undo", "pause", "resume", "revoke", "withdraw",
}

SPECIFIC_KO = {"켜", "끄", "꺼", "추가", "삭제", "포함", "별도", "제외", "오전", "오후", "어제", "오늘", "내일", "주말", "평일",
                "열", "닫", "시작", "중지", "해지", "가입", "올리", "내리", "좋", "나쁘", "피하", "피해", "좋은", "나쁜",
                "설치", "로그인", "로그아웃", "보내", "늘리", "줄이", "이번", "다음", "지난",
                "특급", "빠른배송", "일반배송", "해외", "국내", "무료", "유료", "프리미엄", "베이직", "프로", "플러스",
                "패밀리", "학생", "체험", "취소", "빼", "철회", "보류"}

# Paraphrase lexicon: words that name the same thing (grown on tests/data/cache_pairs.jsonl: see
# bench/results/README.md, "Semantic cache").
SYNONYMS = [
    {"ship", "deliver", "delivery", "shipping", "send"}, {"reset", "recover", "change"},
    {"password", "passcode", "pw"}, {"app", "application"}, {"buy", "purchase"}, {"price", "cost"},
    {"refund", "reimburse", "money back"}, {"cancel", "cancellation", "stop", "terminate"},
    {"register", "signup", "subscribe", "enroll"}, {"login", "log", "signin"}, {"phone", "mobile", "cell"},
    {"store", "shop"}, {"item", "product", "something", "thing"}, {"symptom", "sign"}, {"cause", "reason"},
    {"fee", "charge", "cost", "much"}, {"long", "duration", "time"}, {"change", "update", "edit", "modify", "switch", "set"},
    {"package", "parcel"}, {"history", "record", "log"}, {"safe", "secure"}, {"website", "site"},
    {"picture", "photo", "image"}, {"hour", "time"}, {"copy", "download", "export"}, {"teen", "teenager", "adolescent"},
    {"often", "frequently"}, {"fast", "quickly", "quick"}, {"human", "person", "agent", "representative"},
    {"talk", "speak", "chat"}, {"contact", "reach"}, {"find", "locate", "check", "see", "view", "look"},
    {"top", "first"}, {"pair", "connect"}, {"offer", "sell", "provide", "have"}, {"show", "display", "read"},
    {"common", "typical", "usual"}, {"signature", "sign"}, {"auto", "automatic"}, {"arrive", "come"},
    {"lower", "reduce", "decrease", "cut"}, {"raise", "increase"}, {"forget", "lose"}, {"apply", "enter", "use"},
    {"drain", "die"},
    {"비밀번호", "비번", "패스워드"}, {"재설정", "초기화", "변경", "바꾸"}, {"배송", "택배", "배달"},
    {"앱", "어플", "애플리케이션"}, {"환불", "돈"}, {"취소", "캔슬", "해지"}, {"가입", "등록", "신청", "구독"}, {"제품", "상품", "물건"},  # noqa: E501 - word data
    {"구매", "구입", "사"}, {"가격", "비용", "요금"}, {"판매", "팔"}, {"연결", "페어링"}, {"출력", "인쇄", "프린트"},
    {"교환", "바꿔"}, {"신청", "접수"}, {"방법", "어떻게"}, {"휴대폰", "폰", "핸드폰", "휴대전화"}, {"기록", "내역"},
    {"리뷰", "후기"}, {"공복", "빈속"}, {"회원", "멤버십"}, {"삭제", "지우"}, {"사인", "서명"}, {"커서", "포인터"},
    {"수정", "변경", "바꾸"}, {"발급", "발행"}, {"스크린샷", "캡처", "화면캡처"}, {"모든", "전체", "전부"},
    {"카톡", "카카오톡"}, {"잊어버리", "까먹", "잊"}, {"확인", "보", "조회"}, {"대화", "채팅"}, {"성인", "어른"}, {"원인", "이유"}, {"일반", "기본", "보통"},  # noqa: E501 - word data
    {"작성", "남기"}, {"송장", "운송장"}, {"다운로드", "내려받"}, {"저장공간", "용량", "저장용량"},
]
