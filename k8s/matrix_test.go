package k8s

import (
	"strings"
	"testing"
)

func TestMatrix(t *testing.T) {
	ms, err := Matrix()
	if err != nil {
		t.Fatal(err)
	}
	if !ms[0].Base || ms[0].ModFile() != "go.mod" {
		t.Errorf("the first minor %+v is not the base go.mod builds", ms[0])
	}
	for _, m := range ms[1:] {
		if m.Base || m.ModFile() != "k8s/"+m.Minor+"/go.mod" {
			t.Errorf("%s: base %v, module file %s", m.Minor, m.Base, m.ModFile())
		}
	}
	if n := Newest(ms); n.Status != Supported || n.Staging() != "v0."+strings.TrimPrefix(n.Release, "v1.") {
		t.Errorf("newest %+v, staging %s", n, n.Staging())
	}
}

func TestParseRefuses(t *testing.T) {
	for text, want := range map[string]string{
		"1.35 v1.35.4":                                        "want minor, release and status",
		"1.35 v1.36.3 supported":                              `release "v1.36.3" is not a release of 1.35`,
		"1.35 v1.35.4 stable":                                 `status "stable"`,
		"1.35 v1.35.4 supported helm":                         `"helm": want module@version`,
		"1.36 v1.36.3 supported\n1.35 v1.35.4 supported":      "not newer than the line before",
		"1.38 v1.38.0-beta.0 preview\n1.39 v1.39.0 supported": "supported 1.39 after a preview",
		"1.38 v1.38.0-beta.0 preview":                         "no supported minor",
	} {
		if _, err := parse(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
	ms, err := parse("# c\n1.35 v1.35.4 supported\n1.36 v1.36.3 supported sigs.k8s.io/controller-runtime@v0.24.1\n1.38 v1.38.0-beta.0 preview\n")
	if err != nil || len(ms) != 3 || !ms[0].Base || ms[1].Base || Newest(ms).Minor != "1.36" || ms[1].Pins[0].Version != "v0.24.1" {
		t.Errorf("%+v, %v", ms, err)
	}
}
