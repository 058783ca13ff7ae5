package namespace

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOf(t *testing.T) {
	for _, c := range []struct{ model, ns, want string }{
		{"", "", ""},
		{"", "lora=a", "lora=a"},
		{"m", "", "model=m;"},
		{"m", "lora=a;salt=s", "model=m;lora=a;salt=s"},
		{"a;b%", "salt=x", "model=a%3Bb%25;salt=x"},
	} {
		if got := Of(c.model, c.ns); got != c.want {
			t.Errorf("Of(%q, %q) = %q, want %q", c.model, c.ns, got, c.want)
		}
	}
}

// TestIn: every namespace Of gives for a model is in it, and in no other model's.
func TestIn(t *testing.T) {
	models := []string{"", "m", "mm", "a;b", "a", "a%3Bb", "model=m"}
	nss := []string{"", "lora=a", "salt=s", "lora=x;salt=y"}
	for _, m := range models {
		for _, ns := range nss {
			full := Of(m, ns)
			for _, other := range models {
				if got := In(other, full); got != (other == m) {
					t.Errorf("In(%q, Of(%q, %q) = %q) = %v", other, m, ns, full, got)
				}
			}
		}
	}
	for _, bad := range []string{"model=", "model=m", "model=mx;"} {
		if In("m", bad) {
			t.Errorf("In(m, %q)", bad)
		}
	}
}
