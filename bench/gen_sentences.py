#!/usr/bin/env python3
"""1,000 English sentences of 5-60 words for bench/embed_bench.sh, the same
on every run (a fixed linear congruential generator over a fixed word list,
no library).  Usage: gen_sentences.py OUT.txt"""
import sys

WORDS = """the a an of to in for on with by from at about over after before under between
city river market people government company school family system research water energy
music history science children report policy health power price data network island road
morning evening winter summer village mountain language teacher student doctor engineer
is was are were has had will would can could should may might must does did makes takes
gives finds builds opens closes reads writes moves grows falls rises changes shows keeps
quickly slowly carefully often rarely never always again together almost nearly already
new old large small early late public private local national global simple complex
strong weak bright dark quiet loud modern ancient happy careful useful difficult famous
because although while when where which that who whose but and or so yet if than then
committee proposal budget election festival library hospital airport station garden
computer phone software model question answer problem solution idea story picture film
""".split()


def main():
    out = sys.argv[1]
    state = 20260101
    def rand(n):
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (state >> 33) % n
    with open(out, "w") as f:
        for _ in range(1000):
            n = 5 + rand(56)  # 5..60 words
            words = [WORDS[rand(len(WORDS))] for _ in range(n)]
            s = " ".join(words)
            f.write(s[0].upper() + s[1:] + ".\n")


if __name__ == "__main__":
    main()
