"""Street and postal address patterns: Korean road-name (도로명) and lot-number (지번) addresses,
and the common Western forms (US/UK house number + street type, German/Dutch street + number,
Spanish/French/Italian street type + name + number), each with the unit, city and postcode that
may follow. A bare city or country is not an address and is left alone.

Every repeat is bounded and every alternation anchored on a fixed word, so a scan stays linear
(tests/test_mask_redos.py runs each on max-size near-miss input)."""

from __future__ import annotations

import re

from presidio_analyzer import Pattern

# ---- Korean ------------------------------------------------------------------------------------

# 시/도 (optional) + 시/군/구 (one or two) + 읍/면/동 (optional) + road name ending in 로/길 (optionally
# N번길) + building number. Each part is an atomic, bounded Hangul run ending in its suffix (never
# re-split), and a match starts only where a Hangul word does and a digit follows within 90 chars (a
# match has at most 72 before its first digit): the old unbounded, re-splittable runs backtracked
# cubically (800 × "시": 18 s).
_PROVINCES = "특별자치시|특별자치도|특별시|광역시|도"
_KO_HEAD = rf"(?<![가-힣])(?=[가-힣]\D{{0,90}}+\d)(?>[가-힣]{{2,10}}(?:{_PROVINCES})\s?)?(?>[가-힣]{{1,11}}[시군구]\s?){{1,2}}"
# what may follow the number: 101동 1203호, (역삼동), 3층, B101호
_KO_UNIT = r"(?:,?\s?(?:[A-Za-z]?\d{1,4}동\s?)?[A-Za-z]?\d{1,5}(?:호|층))?(?:\s?\([가-힣0-9,\s]{1,20}\))?"
KOREAN_ROAD_ADDRESS = Pattern(
    "korean road address",
    _KO_HEAD + r"(?>[가-힣]{1,11}[읍면동]\s?)?[가-힣0-9]{1,15}[로길](?:\s?\d{1,4}번?길)?\s?\d{1,5}(?:-\d{1,4})?" + _KO_UNIT,
    0.7,
)
# lot-number addresses: ... 시/군/구 (+ 읍/면) + 동/리/가 + (산) lot number (+ 번지)
KOREAN_LOT_ADDRESS = Pattern(
    "korean lot-number address",
    _KO_HEAD + r"(?>[가-힣]{1,11}[읍면]\s?)?(?>[가-힣0-9]{1,11}[동리가]\s?)(?:산\s?)?\d{1,5}(?:-\d{1,4})?(?:\s?번지)?"
    + _KO_UNIT,
    0.7,
)

# ---- Western -----------------------------------------------------------------------------------

_STREET_TYPES = (
    "Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Terrace|Ter|Place|Pl|Way|Parkway|"
    "Pkwy|Circle|Cir|Highway|Hwy|Square|Sq|Trail|Trl|Crescent|Cres|Close|Row|Mews|Grove|Gardens|Gdns|Hill|"
    "Walk|Park|Loop|Alley|Plaza|Pike|Path|Heights|Green|Rise|Vale|View|Wharf|Quay|Parade|Esplanade|Embankment"
)
_CAP = r"[A-Z][A-Za-z'\.-]{0,24}"  # a capitalised word of a street or city name
_UNIT_EN = r"(?:Apt|Apartment|Suite|Ste|Unit|Flat|Fl|Floor|Room|Rm|#)\.?\s?#?[A-Za-z0-9-]{1,6}"
_US_ZIP = r"[A-Z]{2}\s{1,2}\d{5}(?:-\d{4})?"
_UK_POSTCODE = r"[A-Z]{1,2}\d[A-Z\d]?\s?\d[A-Z]{2}"
# [Flat 3, ] 221B [N ]Baker Street[ NW][, Apt 4][, City[ Name]][, ST 12345 | SW1A 1AA][, Country]
WESTERN_STREET_ADDRESS = Pattern(
    "house number and street",
    rf"(?:\b{_UNIT_EN},?\s)?\b\d{{1,6}}[A-Za-z]?(?:[-/]\d{{1,4}}[A-Za-z]?)?,?\s(?:[NSEW]\.?\s)?"
    rf"(?:{_CAP}\s){{0,4}}(?:{_STREET_TYPES})\b\.?(?:\s(?:N|S|E|W|NE|NW|SE|SW)\b\.?)?"
    rf"(?:,?\s{_UNIT_EN})?(?:,\s{_CAP}(?:\s{_CAP}){{0,2}})?(?:,?\s(?:{_US_ZIP}|{_UK_POSTCODE}))?",
    0.6,
)
# a street whose name carries no type word ("27 Kingsway, Leeds LS1 4AB"): needs the postcode
POSTCODED_STREET = Pattern(
    "house number, street and postcode",
    rf"\b\d{{1,6}}[A-Za-z]?\s(?:{_CAP}\s?){{1,3}},\s(?:{_CAP}\s){{0,2}}{_CAP},?\s(?:{_US_ZIP}|{_UK_POSTCODE})\b",
    0.6,
)
PO_BOX = Pattern("post office box", r"\bP\.?\s?O\.?\s?Box\s\d{1,7}\b", 0.6)

_DE_TYPES = "straße|strasse|str\\.|weg|gasse|allee|platz|ring|damm|ufer|chaussee|steig|pfad|markt|straat|laan|plein|gracht|kade"
_DE_WORD_TYPES = "Straße|Strasse|Str\\.|Weg|Gasse|Allee|Platz|Ring|Damm|Ufer|Chaussee|Markt"
_POSTAL_CITY = r"(?:,?\s(?:D-|A-|CH-|NL-)?\d{4,5}(?:\s?[A-Z]{2})?\s[A-ZÄÖÜ][a-zäöüßA-Z.-]{1,30}(?:\s(?:am|an der|im|ob der)\s[A-ZÄÖÜ][a-zäöüß]{1,20})?)?"  # noqa: E501 - word data
# Hauptstraße 5 | Berliner Straße 12a | Am Markt 3 [, 10115 Berlin]
GERMANIC_STREET_ADDRESS = Pattern(
    "street and house number (German, Dutch)",
    rf"\b(?:[A-ZÄÖÜ][a-zäöüß-]{{1,30}}(?:{_DE_TYPES})|(?:[A-ZÄÖÜ][a-zäöüß-]{{1,30}}\s){{1,2}}(?:{_DE_WORD_TYPES})"
    rf"|(?:Am|An der|Im|Auf der|Zum|Zur)\s[A-ZÄÖÜ][a-zäöüß-]{{1,30}})\s\d{{1,4}}\s?[a-zA-Z]?\b(?:-\d{{1,4}})?{_POSTAL_CITY}",
    0.6,
)
_ROMANCE_TYPES = ("Calle|C/|Avenida|Avda\\.|Av\\.|Plaza|Pza\\.|Paseo|Camino|Carrer|Ronda|Travesía|Via|Viale|Piazza|"
                  "Corso|Largo|Vicolo|Rua|Avenue|Boulevard|Bd|Place|Chemin|Allée|Impasse|Quai|Route|Cours")
_ROMANCE_LINK = r"(?:(?:de|del|de la|de las|de los|la|las|los|el|di|del|della|dei|degli|du|des|d'|l')\s?)"
_ROMANCE_NAME = r"[A-ZÁÉÍÓÚÑÀÈÌÒÙÂÊÎÔÛÇ0-9][\wáéíóúñàèìòùâêîôûçäëïöü'-]{0,25}"
# Calle de Alcalá 42, 3º B, 28014 Madrid | Via Roma 10 | Rua Augusta 55
ROMANCE_STREET_ADDRESS = Pattern(
    "street type, name and number (Spanish, Italian, Portuguese)",
    rf"\b(?:{_ROMANCE_TYPES})\s{_ROMANCE_LINK}{{0,2}}{_ROMANCE_NAME}(?:\s{_ROMANCE_LINK}{{0,2}}{_ROMANCE_NAME}){{0,3}},?"
    r"\s(?:n[º°o]\.?\s?)?\d{1,4}[A-Za-z]?\b(?:,\s?\d{1,2}[º°ª](?:\s?[A-Za-z]\b)?)?(?:,?\s\d{5}\s[A-ZÁÉÍÓÚ][\wáéíóúñ-]{1,30})?",
    0.6,
)
_FR_TYPES = "rue|avenue|av\\.|boulevard|bd|place|chemin|allée|impasse|quai|route|cours|passage|square"
# 12 rue de Rivoli, 75001 Paris | 3 bis avenue Foch
FRENCH_STREET_ADDRESS = Pattern(
    "number, street type and name (French)",
    rf"\b\d{{1,4}}(?:\s?(?:bis|ter))?,?\s(?i:{_FR_TYPES})\s{_ROMANCE_LINK}{{0,2}}{_ROMANCE_NAME}"
    rf"(?:\s{_ROMANCE_LINK}{{0,2}}{_ROMANCE_NAME}){{0,3}}(?:,?\s\d{{5}}\s[A-ZÀ-Ý][\wà-ÿ-]{{1,30}})?",
    0.6,
)

# Oudegracht 233bis, 3511 NS Utrecht | Nowy Świat 27/4, 00-029 Warszawa: street + number + a
# European postcode + city (the postcode is what makes it an address)
_EU_NAME = r"[A-ZÀ-Ž][\wÀ-ž'-]{1,25}"
POSTCODE_CITY_STREET = Pattern(
    "street, number, postcode and city (European)",
    rf"\b{_EU_NAME}(?:\s{_EU_NAME}){{0,2}}\s\d{{1,4}}[A-Za-z]{{0,3}}(?:[/-][A-Za-z0-9]{{1,4}})?,\s"
    rf"(?:\d{{4}}\s?[A-Z]{{2}}|\d{{2}}-\d{{3}}|\d{{4}}-\d{{3}}|\d{{4,5}})\s{_EU_NAME}",
    0.6,
)
# 2-4-1 Umeda, Kita-ku, Osaka 530-0001 (Japanese chome-ban-go); 45 Yeonhui-ro 11-gil, Seodaemun-gu
# (Korean, romanised)
ROMANISED_EAST_ASIAN_ADDRESS = Pattern(
    "romanised Japanese or Korean address",
    r"\b(?:\d{1,2}-\d{1,2}-\d{1,3}\s[A-Z][a-z]{1,20},\s[A-Z][a-z]{1,20}-(?:ku|shi|cho|machi|gun)"
    r"|\d{1,4}\s[A-Z][a-z]{1,20}-(?:ro|gil|daero)(?:\s\d{1,3}(?:beon)?-gil)?,\s[A-Z][a-z]{1,20}-(?:gu|si|gun))\b",
    0.6,
)
# 210 W 89th St: a numbered street
NUMBERED_STREET = Pattern(
    "house number and numbered street",
    rf"\b\d{{1,6}}\s(?:[NSEW]\.?\s)?\d{{1,3}}(?:st|nd|rd|th)\s(?:{_STREET_TYPES})\b\.?",
    0.6,
)

PATTERNS = [KOREAN_ROAD_ADDRESS, KOREAN_LOT_ADDRESS, WESTERN_STREET_ADDRESS, POSTCODED_STREET, PO_BOX,
            GERMANIC_STREET_ADDRESS, ROMANCE_STREET_ADDRESS, FRENCH_STREET_ADDRESS, POSTCODE_CITY_STREET,
            ROMANISED_EAST_ASIAN_ADDRESS, NUMBERED_STREET]

# ---- growing a found address to its whole ---------------------------------------------------
# A pattern finds an address's core; the unit, floor, building, postcode, city and region around it
# are part of it too (a masked street with the flat number left in clear still locates a person).
# Each piece is tried at the edge of the span only, bounded, and at most _GROW_STEPS times.

_KO_REGION = (r"(?:서울|부산|대구|인천|광주|대전|울산|세종|경기|강원|충북|충남|전북|전남|경북|경남|제주"
              r"|[가-힣]{2,6}(?:특별시|광역시|특별자치시|특별자치도|도))(?:\s[가-힣]{1,5}시)?\s$")
_EN_UNIT_BEFORE = r"(?:Apartment|Apt|Suite|Ste|Unit|Flat|Room|Rm)\.?\s?[A-Za-z0-9/-]{1,6},?\s$"
_LEFT = [re.compile(_KO_REGION), re.compile(_EN_UNIT_BEFORE), re.compile(r"(?:Van|Von|De|La|Le|San|Santa|St\.|Saint)\s$")]
_RIGHT = [re.compile(p) for p in (
    # 110동 2003호, 3층 305호, 지하 1층, B동 1701호, 센텀파크 103동 2401호
    r",?\s?(?:[가-힣A-Za-z]{2,12}\s)?(?:지하\s?)?(?:[A-Za-z]\d{0,4}|\d{1,4})(?:동|층|호)(?:\s?[A-Za-z]?\d{1,5}(?:호|층))?",
    r"-[A-Z0-9]{1,4}\b|(?<=\d)(?:bis|ter)\b",  # 418-H, 512-II, 233bis
    r",?\s(?:Suite|Ste|Unit|Apt|Apartment|Flat|Floor|Fl|Room|Bldg|Building|Bât)\.?\s?[A-Za-z0-9/-]{1,6}",
    # postcode + city: 1017 KH Amsterdam, 00-029 Warszawa, 75009 Paris, 1100-053 Lisboa
    r",?\s(?:[A-Z]{1,2}-)?\d{2,5}(?:-\d{3,4})?(?:\s?[A-Z]{2})?\s[A-ZÀ-Ž][A-Za-zÀ-ž-]{1,25}",
    # region and postcode: NSW 2037, ON M5R 2A5, NY 10024, QLD 4007, Co. Cork P24 X2C9, Tokyo 150-0001
    r",?\s(?:Co\.\s[A-Z][a-z]+|[A-Z]{2,3}|[A-Z][a-z]{2,20})\s(?:\d{3}-\d{4}|\d{4,6}|[A-Z]\d[A-Z]\s?\d[A-Z]\d"
    r"|[A-Z]\d{2}\s?[A-Z0-9]{4}|[A-Z]{1,2}\d[A-Z\d]?\s?\d[A-Z]{2})\b",
    r",?\s(?:[A-Z]{1,2}\d[A-Z\d]?\s?\d[A-Z]{2}|\d{4,5}(?:-\d{4})?|\d{3}-\d{4})\b",  # a postcode alone
    # a floor and door: ", 2º izq.", ", 4e étage", ", 4º 2ª" (after the postcode: ", 75" is not a floor)
    r",\s?\d{1,2}(?:º|ª|e|er|st|nd|rd|th)(?!\w)(?:\s?\d{1,2}(?:º|ª))?(?:\s(?:izq|dcha|der|Esq|Dto|étage|floor|piso)\.?)?",
    r"\s(?:izq|dcha|der|Esq|Dto|étage|piso)\b\.?",
    # a city or district: ", Kadıköy", ", Toronto", ", Victoria Island", ", Kita-ku"
    r",\s[A-ZÀ-Ž][A-Za-zÀ-ž'.-]{1,25}(?:\s[A-ZÀ-Ž][A-Za-zÀ-ž'.-]{1,25})?(?=[,;.)]|\s(?:\d|[A-Z]{2}\b)|$)",
    r"\s\d{1,2}(?:º|ª)",  # the door after the floor: 4º 2ª
)]
_GROW_STEPS = 6


def grow(text: str, start: int, end: int) -> tuple[int, int]:
    """The span of an address found at [start, end), grown over the pieces around it."""
    for _ in range(_GROW_STEPS):
        grown = False
        for rx in _RIGHT:
            m = rx.match(text, end)
            if m and m.end() > end:
                end, grown = m.end(), True
                break
        head = text[max(0, start - 40):start]
        for rx in _LEFT:
            m = rx.search(head)
            if m:
                start, grown = start - (len(head) - m.start()), True
                break
        if not grown:
            break
    return start, end
