package config

import (
	"os"
	"strings"
	"testing"
)

func TestDynamicMIGArgsOf(t *testing.T) {
	shipped, err := os.ReadFile("../manifests/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	two := `profiles:
- schedulerName: a
  pluginConfig: [{name: DynamicMIG, args: {nodeSchedulerPolicy: spread}}]
- schedulerName: b
  pluginConfig: [{name: DynamicMIG, args: {nodeSchedulerPolicy: binpack}}]
`
	for _, tc := range []struct {
		name, config, scheduler string
		wantPolicy, wantErr     string
	}{
		{"the shipped config", string(shipped), "dynamig-scheduler", "binpack", ""},
		{"the shipped config, no name", string(shipped), "", "binpack", ""},
		{"named profile", two, "a", "spread", ""},
		{"no such profile", two, "c", "", `no profile has schedulerName "c"`},
		{"two profiles, no name", two, "", "", "profiles [a b] all configure DynamicMIG"},
		{"no args: defaults", "profiles: [{schedulerName: x}]", "x", "binpack", ""},
		{"bad args name the field", "profiles: [{schedulerName: x, pluginConfig: [{name: DynamicMIG, args: {nodeSchedulerPolicy: tight}}]}]", "x", "", "nodeSchedulerPolicy"},
		{"unknown field", "profiles: [{schedulerName: x, pluginConfig: [{name: DynamicMIG, args: {nodePolicy: spread}}]}]", "x", "", "nodePolicy"},
		{"not YAML", "profiles: [", "", "", "KubeSchedulerConfiguration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, err := DynamicMIGArgsOf([]byte(tc.config), tc.scheduler)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want %q", err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("%v", err)
			case args.NodeSchedulerPolicy != tc.wantPolicy:
				t.Errorf("nodeSchedulerPolicy %q, want %q", args.NodeSchedulerPolicy, tc.wantPolicy)
			}
		})
	}
}

// TestDynamicMIGArgsAsWritten: the profile's args as written, no defaults added, and its
// name; nil for a profile without args.
func TestDynamicMIGArgsAsWritten(t *testing.T) {
	written, profile, err := DynamicMIGArgsAsWritten([]byte("profiles: [{schedulerName: x, pluginConfig: [{name: DynamicMIG, args: {nodeSchedulerPolicy: spread}}]}]"), "")
	if err != nil || profile != "x" || len(written) != 1 || written["nodeSchedulerPolicy"] != "spread" {
		t.Errorf("%v, %q, %v", written, profile, err)
	}
	written, profile, err = DynamicMIGArgsAsWritten([]byte("profiles: [{schedulerName: z}]"), "z")
	if err != nil || profile != "z" || written != nil {
		t.Errorf("no args: %v, %q, %v", written, profile, err)
	}
}

// FuzzDynamicMIGArgsOf: a KubeSchedulerConfiguration as kubectl dynamig and the sandbox read
// it. Never a panic; the args found are valid.
func FuzzDynamicMIGArgsOf(f *testing.F) {
	f.Add([]byte("profiles:\n- schedulerName: dynamig-scheduler\n  pluginConfig:\n  - name: DynamicMIG\n    args: {migGPUSchedulerPolicy: spread}\n"), "dynamig-scheduler")
	f.Add([]byte("profiles: [{schedulerName: a}, {schedulerName: b, pluginConfig: [{name: DynamicMIG}]}]"), "")
	f.Add([]byte("profiles: 3"), "x")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		args, err := DynamicMIGArgsOf(data, name)
		if err != nil {
			return
		}
		if errs := args.Validate(); len(errs) > 0 {
			t.Fatalf("args found are invalid: %v", errs)
		}
	})
}
