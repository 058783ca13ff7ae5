package tokenize

// byteRunes is GPT-2's bytes_to_unicode table: the printable character a byte-level
// vocabulary writes for each byte. Bytes that are printable Latin-1 stand for themselves;
// the other 68 are shifted to U+0100 onwards in byte order. The tokenizer never builds
// such strings on its hot path: Load converts every vocabulary entry back to raw bytes
// once (byteLevelDecode), so BPE runs on the text's own bytes.
var byteRunes = func() (t [256]rune) {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			t[b] = rune(b)
			continue
		}
		t[b] = 256 + n
		n++
	}
	return t
}()

// runeBytes inverts byteRunes (index: the rune, below 0x144).
var runeBytes = func() (t [0x144]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteRunes {
		t[r] = int16(b)
	}
	return t
}()

// byteLevelDecode returns the raw bytes a byte-level vocabulary entry stands for, or
// false when s holds a character outside the byte alphabet (such entries cannot be
// produced by byte-level BPE; added tokens are handled apart).
func byteLevelDecode(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r < 0 || int(r) >= len(runeBytes) || runeBytes[r] < 0 {
			return nil, false
		}
		out = append(out, byte(runeBytes[r]))
	}
	return out, true
}
