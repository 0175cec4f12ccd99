package sim

import (
	"reflect"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/config"
)

func TestParseGPUList(t *testing.T) {
	specs := func(models ...string) []GPUSpec {
		var out []GPUSpec
		for _, m := range models {
			out = append(out, GPUSpec{Model: m})
		}
		return out
	}
	good := []struct {
		in   string
		want []GPUSpec
	}{
		{"A100-40GB", specs("A100-40GB")},
		{"A100-40GB:2,H100-80GB:1", specs("A100-40GB", "A100-40GB", "H100-80GB")},
		{" A100-40GB : 2 , A30-24GB ", specs("A100-40GB", "A100-40GB", "A30-24GB")},
		{"NVIDIA A100-PCIE-40GB:1", specs("NVIDIA A100-PCIE-40GB")},
		{"NVIDIA RTX PRO 6000 Blackwell Server Edition:2", specs("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Server Edition")},
		{"NVIDIA H100 80GB HBM3", specs("NVIDIA H100 80GB HBM3")},
		{"H200-SXM5:01", specs("H200-SXM5")},
		{"a30:3", specs("a30", "a30", "a30")},
	}
	for _, tc := range good {
		got, err := ParseGPUList(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseGPUList(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if got, _ := ParseGPUList("B200-180GB:64"); len(got) != 64 {
		t.Errorf("count 64 gave %d GPUs", len(got))
	}

	bad := []struct {
		in, names string // names: the text the error must quote
	}{
		{"", ""},
		{"   ", ""},
		{"V100", "V100"},
		{"A100-40GB:0", "A100-40GB:0"},
		{"A100-40GB:65", "A100-40GB:65"},
		{"A100-40GB:99999999999999999999999", "A100-40GB:99999999999999999999999"},
		{"A100-40GB:-1", "A100-40GB:-1"},
		{"A100-40GB:two", "A100-40GB:two"},
		{"A100-40GB:", "A100-40GB:"},
		{":2", ":2"},
		{"A100-40GB,,H100-80GB", `""`},
		{"A100-40GB,", `""`},
		{"A100-40GB:2,H100", "H100"},
		{"A100", "A100"},
	}
	for _, tc := range bad {
		_, err := ParseGPUList(tc.in)
		if err == nil {
			t.Errorf("ParseGPUList(%q) succeeded", tc.in)
			continue
		}
		if !strings.Contains(err.Error(), tc.names) {
			t.Errorf("ParseGPUList(%q): %v does not name %s", tc.in, err, tc.names)
		}
		if !strings.Contains(err.Error(), "A100-40GB, NVIDIA A100-SXM4-40GB") {
			t.Errorf("ParseGPUList(%q): %v does not list the known models", tc.in, err)
		}
	}
}

// FuzzParseGPUList: ParseGPUList never panics, and what it accepts New accepts.
func FuzzParseGPUList(f *testing.F) {
	for _, s := range []string{"", "A100-40GB:2,H100-80GB:1", "NVIDIA A100-PCIE-40GB:1", "a:b:3", ",", ":", "A30:64", "A30:65"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		specs, err := ParseGPUList(s)
		if err != nil {
			return
		}
		if len(specs) == 0 {
			t.Fatalf("ParseGPUList(%q) accepted no GPUs", s)
		}
		for _, spec := range specs {
			if _, ok := config.LookupModel(spec.Model); !ok {
				t.Fatalf("ParseGPUList(%q) accepted unknown model %q", s, spec.Model)
			}
		}
		if _, err := New(Options{Seed: s}, specs...); err != nil {
			t.Fatalf("New rejects what ParseGPUList(%q) accepted: %v", s, err)
		}
	})
}
