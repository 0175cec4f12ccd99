package app

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/nvml/sim"
)

func TestRunFlags(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		errSubstr string
	}{
		{"nvcdi on simulated GPUs", []string{"--device-edits=nvcdi"}, `--device-edits=nvcdi needs real GPUs: not with --nvml=sim`},
		{"unknown value", []string{"--device-edits=cdi"}, `--device-edits must be "auto", "nvcdi" or "env", not "cdi"`},
		{"empty value", []string{"--device-edits="}, `--device-edits must be "auto", "nvcdi" or "env", not ""`},
		// Valid values get past the flag to the next check: no cluster here.
		{"env", []string{"--device-edits=env"}, "in-cluster configuration"},
		{"auto", []string{"--device-edits=auto"}, "in-cluster configuration"},
		{"defaults", nil, "in-cluster configuration"},
		{"zero QPS", []string{"--kube-api-qps=0"}, "--kube-api-qps and --kube-api-burst must be positive, not 0 and 100"},
		{"negative burst", []string{"--kube-api-burst=-1"}, "--kube-api-qps and --kube-api-burst must be positive, not 50 and -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--nvml=sim", "--sim-gpus=A30", "--node-name=n1"}, tc.args...)
			code, _, stderr := run(args...)
			if code != exitUsage || !strings.Contains(stderr, tc.errSubstr) {
				t.Errorf("exit %d (want %d), stderr %q (want %q)", code, exitUsage, stderr, tc.errSubstr)
			}
		})
	}
}

func TestDeviceEditsMode(t *testing.T) {
	given, err := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "NVIDIA H200"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flag, backend string
		sandbox       bool
		want          string
	}{
		{"auto", "real", false, deviceEditsNVCDI},
		{"auto", "sim", false, deviceEditsEnv},
		{"auto", "real", true, deviceEditsEnv}, // a library given by the sandbox: simulated
		{"env", "real", false, deviceEditsEnv},
		{"env", "sim", false, deviceEditsEnv},
		{"nvcdi", "real", false, deviceEditsNVCDI},
		{"nvcdi", "sim", false, ""},
		{"NVCDI", "real", false, ""},
	} {
		o := &runOptions{deviceEdits: tc.flag, nvml: nvmlFlags{backend: tc.backend}}
		if tc.sandbox {
			o.nvml.given = given
		}
		got, err := o.deviceEditsMode()
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("--device-edits=%s --nvml=%s (given library %v): %q, %v; want %q", tc.flag, tc.backend, tc.sandbox, got, err, tc.want)
		}
	}
}

func TestParseXIDs(t *testing.T) {
	for flag, want := range map[string]string{"": "[]", "13, 31,43": "[13 31 43]", "13,x": `--ignored-xids="13,x": "x" is not an XID (a decimal number)`} {
		got, err := parseXIDs(flag)
		s := fmt.Sprint(got)
		if err != nil {
			s = err.Error()
		}
		if s != want || (flag == "" && got == nil) {
			t.Errorf("parseXIDs(%q) = %s, want %s", flag, s, want)
		}
	}
}
