package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestKubernetesVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		deps []*debug.Module
		want string
	}{
		{"kubernetes linked", []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.35.4"}, {Path: "k8s.io/kubernetes", Version: "v1.35.4"}}, "v1.35.4"},
		{"client-go only", []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.35.1"}}, "v1.35.1"},
		{"client-go replaced", []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.0.0", Replace: &debug.Module{Path: "k8s.io/client-go", Version: "v0.35.4"}}}, "v1.35.4"},
		{"none", nil, "unknown"},
	} {
		if got := kubernetes(tc.deps); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestString(t *testing.T) {
	got := Info{Version: "v0.1.0", Commit: "abc", Kubernetes: "v1.35.4", Go: "go1.26.8"}.String("dynamig-webhook")
	if want := "dynamig-webhook v0.1.0 (commit abc, Kubernetes v1.35.4, go1.26.8)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if s := Get().String("x"); !strings.HasPrefix(s, "x dev (commit ") {
		t.Errorf("unstamped: %q", s)
	}
}
