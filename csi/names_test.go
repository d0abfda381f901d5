package csi

import (
	"strings"
	"testing"
)

func TestValidateDriverName(t *testing.T) {
	for _, name := range []string{"a.example.com", "Upper.Example.com", "x", "csi-hostpath", strings.Repeat("a", 63)} {
		if err := ValidateDriverName(name); err != nil {
			t.Errorf("ValidateDriverName(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"", ".", "..", "../x", "a/b", "-a", "a-", "a_b", "a b", "a\x00b", strings.Repeat("a", 64), strings.Repeat("a", 300),
		"\u212a.example.com", "\u212A8s.io", "a.\u212a"} { // Kelvin sign, which strings.ToLower makes "k"
		if err := ValidateDriverName(name); err == nil {
			t.Errorf("ValidateDriverName(%q) = nil, want an error", name)
		}
	}
}
