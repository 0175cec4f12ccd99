package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynamig/dynamig/test/sandbox"
)

const install = "../../manifests/install.yaml"

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown model", []string{"--config", write("model.yaml", "nodes: [{name: a, mode: mig, gpus: [A100-41GB]}]")}, "nodes[0].gpus[0]"},
		{"unknown mode", []string{"--config", write("mode.yaml", "nodes: [{name: a, mode: mps, gpus: [A100-40GB]}]")}, "nodes[0].mode"},
		{"duplicate node", []string{"--config", write("dup.yaml", "nodes: [{name: a, mode: mig, gpus: [A30]}, {name: a, mode: mig, gpus: [A30]}]")}, `nodes[1].name: Duplicate value: "a"`},
		{"bad device config", []string{"--config", write("dev.yaml", "nodes: [{name: a, mode: mig, gpus: [A30]}]\ndeviceConfig: nvidia.yaml\n"), "--install", install}, "deviceConfig"},
		{"missing config", []string{"--config", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"missing install manifest", []string{"--install", filepath.Join(dir, "none.yaml")}, "--install"},
		{"unknown flag", []string{"--nodes=3"}, "flag provided but not defined"},
		{"argument", []string{"extra"}, `unexpected argument "extra"`},
		{"bad -v", []string{"-v=x"}, "-v"},
		{"demo: no examples", []string{"demo", "--examples", t.TempDir()}, "no Pods"},
		{"demo: unknown flag", []string{"demo", "--config", "x"}, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "bad device config" {
				write("nvidia.yaml", "nvidia:\n  deviceSplitCount: 0\n")
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, stdout.String(), stderr.String(), tc.want)
			}
		})
	}
}

// TestRun runs the sandbox as the command does: `ready` once, the state file, a
// kubeconfig that client-go can use; SIGINT (the context) stops it with exit 0.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	dir := t.TempDir()
	kubeconfig, state := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "state.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		code := run(ctx, []string{"--kubeconfig-out", kubeconfig, "--state-out", state, "--install", install}, pw, &stderr)
		pw.Close()
		done <- code
	}()
	lines := bufio.NewScanner(pr)
	ready := make(chan bool, 1)
	go func() {
		ok := lines.Scan() && lines.Text() == "ready"
		ready <- ok
		for lines.Scan() {
			t.Errorf("more on stdout: %q", lines.Text())
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("stdout did not say ready; stderr: %s", stderr.String())
		}
	case code := <-done:
		t.Fatalf("exited %d before ready: %s", code, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatal("not ready within 2 minutes")
	}

	raw, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var st sandbox.State
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.APIServer, "https://127.0.0.1:") || st.Kubeconfig != kubeconfig || st.SchedulerMetrics == "" ||
		st.Nodes["mig-node"].Mode != "mig" || st.Nodes["core-node"].DeviceMetrics == "" || len(st.Nodes["mig-node"].GPUs) != 1 {
		t.Errorf("state: %s", raw)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 2 {
		t.Errorf("nodes through the written kubeconfig: %v, %v", nodes, err)
	}

	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after SIGINT: %s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("did not stop within a minute")
	}
}

// TestDemo runs `dynamig-sandbox demo` on the examples.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"demo", "--examples", "../../examples", "--install", install}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d: %s\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	if err := checkExamplesOccupancy(out); err != nil {
		t.Errorf("%v:\n%s", err, out)
	}
	for _, want := range []string{
		`"migUUID": "MIG-`,
		"pod default/gpu-pod1: ",
		"; schedulerName dynamig-scheduler (set by dynamig-webhook)",
		"examples deleted: mig-node GPU-",
		"(NVIDIA A100-PCIE-40GB): [0,8) free",
		"the sandbox stopped cleanly",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "2g.10gb ["); n != 3 {
		t.Errorf("want 3 instances in the device plugin's report, got %d:\n%s", n, out)
	}
	// The Deployment's replicas, one 1g.5gb instance each, at every scale.
	for replicas, want := range map[string]int{"replicas 1:": 1, "replicas 4:": 4, "replicas 2:": 2} {
		i := strings.Index(out, replicas)
		if i < 0 {
			t.Errorf("output lacks %q:\n%s", replicas, out)
			continue
		}
		line, _, _ := strings.Cut(out[i:], "\n")
		if n := strings.Count(line, " infer-"); n != want || strings.Count(line, "1g.5gb") != want {
			t.Errorf("%s %d replicas' instances, want %d: %s", replicas, n, want, line)
		}
	}
}

// examplesOccupancy is the A100's occupancy line the demo prints while both examples run.
const examplesOccupancy = "(NVIDIA A100-PCIE-40GB): "

// checkExamplesOccupancy checks that the examples' three 2g.10gb instances (two of gpu-pod1,
// one of mig-workload) fill the A100's first six slots and leave [6,8) free. Which example
// takes [0,2) depends on which one kube-scheduler schedules first: both are pending at once
// (a CI run under load scheduled mig-workload first; 8 runs here, 4 of them beside three busy
// loops, scheduled gpu-pod1 first), and the demo states no order.
func checkExamplesOccupancy(out string) error {
	i := strings.Index(out, examplesOccupancy+"[0,2) ")
	if i < 0 {
		return fmt.Errorf("output lacks the examples' occupancy line %q", examplesOccupancy+"[0,2) ...")
	}
	line, _, _ := strings.Cut(out[i+len(examplesOccupancy):], "\n")
	var at, owners []string
	for _, part := range strings.Split(line, " | ") {
		placement, owner, _ := strings.Cut(part, " ")
		at = append(at, placement)
		owners = append(owners, owner)
	}
	slices.Sort(owners[:min(3, len(owners))])
	if got, want := strings.Join(at, " "), "[0,2) [2,4) [4,6) [6,8)"; got != want ||
		!slices.Equal(owners, []string{"gpu-pod1 2g.10gb", "gpu-pod1 2g.10gb", "mig-workload 2g.10gb", "free"}) {
		return fmt.Errorf("the examples' occupancy %q: want gpu-pod1's two and mig-workload's one 2g.10gb at [0,2), [2,4), [4,6) in either order, [6,8) free", line)
	}
	return nil
}

// TestCheckExamplesOccupancy: either example may be scheduled first (a CI run scheduled
// mig-workload first); anything else is refused.
func TestCheckExamplesOccupancy(t *testing.T) {
	const head = "  mig-node GPU-1e4b6a9d-4fff-a516-3e24-1d86151d01bc " + examplesOccupancy
	for line, ok := range map[string]bool{
		"[0,2) gpu-pod1 2g.10gb | [2,4) gpu-pod1 2g.10gb | [4,6) mig-workload 2g.10gb | [6,8) free": true,
		"[0,2) mig-workload 2g.10gb | [2,4) gpu-pod1 2g.10gb | [4,6) gpu-pod1 2g.10gb | [6,8) free": true,
		"[0,2) gpu-pod1 2g.10gb | [2,4) mig-workload 2g.10gb | [4,6) gpu-pod1 2g.10gb | [6,8) free": true,
		"[0,2) gpu-pod1 2g.10gb | [2,4) gpu-pod1 2g.10gb | [4,6) free | [6,8) mig-workload 2g.10gb": false,
		"[0,2) gpu-pod1 2g.10gb | [2,4) gpu-pod1 2g.10gb | [4,6) gpu-pod1 2g.10gb | [6,8) free":     false,
		"[0,2) gpu-pod1 2g.10gb | [2,4) mig-workload 2g.10gb | [4,8) free":                          false,
		"[0,2) gpu-pod1 3g.20gb | [2,4) gpu-pod1 2g.10gb | [4,6) mig-workload 2g.10gb | [6,8) free": false,
	} {
		out := "Running\n" + head + line + "\n  core-node ...\n"
		if err := checkExamplesOccupancy(out); (err == nil) != ok {
			t.Errorf("%s: accepted %v, want %v (%v)", line, err == nil, ok, err)
		}
	}
	if checkExamplesOccupancy("no occupancy") == nil {
		t.Error("output without the line accepted")
	}
}
