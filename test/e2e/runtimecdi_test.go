package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRuntimeIgnoringCDI: a CUDA image sets NVIDIA_VISIBLE_DEVICES=all. On a node whose
// runtime ignores CDI (containerd 1.7 without enable_cdi) its container sees Allocate's void,
// so no GPU (never every GPU of the node), and a Warning CDINotApplied is on the pod and on
// the Node, and the device plugin's metric says so; on a node whose runtime applies CDI the
// same pod sees exactly its own MIG device and gets no warning.
func TestRuntimeIgnoringCDI(t *testing.T) {
	off, on := mig("cdi-off", "A100-40GB"), mig("cdi-on", "A100-40GB")
	off.RuntimeIgnoresCDI = true
	w := start(t, off, on)
	for _, node := range []string{"cdi-off", "cdi-on"} {
		p := pinned("cuda-"+node, "mig", 4000, node)
		p.Spec.Containers[0].Image = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
		w.Create(p)
	}
	recs := w.Running("cuda-cdi-off", "cuda-cdi-on")

	env, err := w.SB.ContainerEnv(w.Ctx, "default", "cuda-cdi-off", "main")
	if err != nil {
		t.Fatal(err)
	}
	if got := env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
		t.Errorf("on a runtime that ignores CDI, cuda-cdi-off sees NVIDIA_VISIBLE_DEVICES=%q, want void", got)
	}
	w.seesOwnDevices("cuda-cdi-on", "main", recs["cuda-cdi-on"])

	w.WaitFor("Warning CDINotApplied on cuda-cdi-off and on Node cdi-off", 30*time.Second, func() (bool, string) {
		evs, err := w.C.CoreV1().Events("").List(w.Ctx, metav1.ListOptions{FieldSelector: "reason=CDINotApplied"})
		if err != nil {
			return false, err.Error()
		}
		var pod, node bool
		var seen []string
		for _, e := range evs.Items {
			o := e.InvolvedObject
			seen = append(seen, fmt.Sprintf("%s %s/%s: %s", e.Type, o.Kind, o.Name, e.Message))
			if e.Type != v1.EventTypeWarning || !strings.Contains(e.Message, "enable_cdi") {
				continue
			}
			switch {
			case o.Kind == "Pod" && o.Name == "cuda-cdi-off":
				pod = true
			case o.Kind == "Node" && o.Name == "cdi-off":
				node = true
			default:
				return false, "a CDINotApplied where the runtime applies CDI: " + strings.Join(seen, "; ")
			}
		}
		return pod && node, fmt.Sprintf("pod %v, node %v: %v", pod, node, seen)
	})
	for _, n := range w.SB.Nodes() {
		want := map[string]string{"cdi-off": `state="ignores"`, "cdi-on": `state="applies"`}[n.Name]
		if got := runtimeCDIMetric(t, n.DeviceMetrics); !strings.Contains(got, want) || !strings.Contains(got, `node="`+n.Name+`"`) {
			t.Errorf("%s: dynamig_device_plugin_runtime_cdi is %q, want %s", n.Name, got, want)
		}
	}
	// No GPU was handed out on the node that ignores CDI, but the reservation holds its
	// instance: what the Warning tells the user to fix.
	if len(recs["cuda-cdi-off"]) != 1 || recs["cuda-cdi-off"][0].Profile != "1g.5gb" {
		t.Errorf("cuda-cdi-off reservation %v, want one 1g.5gb", recs["cuda-cdi-off"])
	}
}

// runtimeCDIMetric is the device plugin's dynamig_device_plugin_runtime_cdi sample lines.
func runtimeCDIMetric(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "dynamig_device_plugin_runtime_cdi{") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
