// Package runtimecdi tells whether the node's container runtime applies the CDI devices the
// kubelet passes it, asked over the CRI (Version, and Status with verbose info, as `crictl
// info` asks). The device plugin hands devices over as CDI names; a runtime that ignores them
// (containerd before 1.7, or 1.7 with enable_cdi = false, its default) starts the container
// without its GPU and says nothing. Only the runtime knows; the kubelet does not report it.
package runtimecdi

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/version"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// DefaultEndpoints are the runtimes' sockets at their usual host paths (containerd, CRI-O,
// k3s's containerd), asked in this order, as crictl's defaults are.
var DefaultEndpoints = []string{
	"unix:///run/containerd/containerd.sock",
	"unix:///run/crio/crio.sock",
	"unix:///run/k3s/containerd/containerd.sock",
}

// State is what is known of the runtime's CDI support.
type State string

const (
	// Applies: the runtime resolves CDI names against the spec directory.
	Applies State = "applies"
	// Ignores: the runtime drops CDI names; containers start without the devices.
	Ignores State = "ignores"
	// Unknown: the runtime could not be asked, or its answer does not tell.
	Unknown State = "unknown"
)

// Verdict is what the runtime's answer says.
type Verdict struct {
	State State
	// Runtime names the runtime and its version ("containerd v1.7.22"), when known.
	Runtime string
	// Why says what decided it, in the runtime's own terms ("enable_cdi = false").
	Why string
}

func (v Verdict) String() string {
	s := string(v.State)
	if v.Runtime != "" {
		s = v.Runtime + " " + s + " CDI devices"
	}
	if v.Why != "" {
		s += " (" + v.Why + ")"
	}
	return s
}

// maxInfo bounds the verbose info judged: containerd's config is a few KiB.
const maxInfo = 1 << 20

// Judge reads a runtime's Version and verbose Status info. containerd reports its CRI
// configuration as JSON under "config" (`crictl info | jq .config.enableCDI`), which is the
// setting itself; without it the version decides where it can (CDI came with 1.7; 2.0 turned it
// on by default). CRI-O applies CDI in every release a supported kubelet runs with.
func Judge(runtimeName, runtimeVersion string, info map[string]string) Verdict {
	v := Verdict{State: Unknown, Runtime: strings.TrimSpace(runtimeName + " " + runtimeVersion)}
	switch strings.ToLower(runtimeName) {
	case "containerd":
		if raw := info["config"]; raw != "" && len(raw) <= maxInfo {
			var cfg struct {
				EnableCDI *bool `json:"enableCDI"`
			}
			if err := json.Unmarshal([]byte(raw), &cfg); err == nil && cfg.EnableCDI != nil {
				if *cfg.EnableCDI {
					v.State, v.Why = Applies, "enable_cdi = true"
				} else {
					v.State, v.Why = Ignores, "enable_cdi = false"
				}
				return v
			}
		}
		ver, err := version.ParseGeneric(runtimeVersion)
		switch {
		case err != nil:
			v.Why = fmt.Sprintf("version %q unreadable and no enable_cdi in its info", runtimeVersion)
		case ver.LessThan(version.MajorMinor(1, 7)):
			v.State, v.Why = Ignores, "containerd before 1.7 has no CDI"
		case !ver.LessThan(version.MajorMinor(2, 0)):
			v.State, v.Why = Applies, "on by default since containerd 2.0"
		default:
			v.Why = "no enable_cdi in its info"
		}
	case "cri-o":
		v.State, v.Why = Applies, "CRI-O applies CDI"
	default:
		v.Why = "a runtime this check does not know"
	}
	return v
}

// Ask asks the runtime at endpoint (unix:///path).
func Ask(ctx context.Context, endpoint string) (Verdict, error) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Verdict{State: Unknown}, fmt.Errorf("runtime endpoint %s: %w", endpoint, err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ver, err := client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return Verdict{State: Unknown}, fmt.Errorf("runtime endpoint %s: Version: %w", endpoint, err)
	}
	status, err := client.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return Verdict{State: Unknown}, fmt.Errorf("runtime endpoint %s: Status: %w", endpoint, err)
	}
	return Judge(ver.GetRuntimeName(), ver.GetRuntimeVersion(), status.GetInfo()), nil
}

// Watcher asks the first of Endpoints whose socket exists, at start and every Interval (a
// runtime reconfigured and restarted under a running plugin is seen), and keeps the verdict.
type Watcher struct {
	Endpoints []string
	Interval  time.Duration
	// OnChange, if set, is called with each verdict that differs from the last.
	OnChange func(Verdict)

	mu      sync.Mutex
	current Verdict
}

// Current is the last verdict (Unknown before the first answer).
func (w *Watcher) Current() Verdict {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.current.State == "" {
		return Verdict{State: Unknown}
	}
	return w.current
}

// Run asks again every Interval (default 5 minutes) until ctx ends; the first Check is the
// caller's. With no endpoints it asks nothing.
func (w *Watcher) Run(ctx context.Context) {
	if len(w.Endpoints) == 0 {
		return
	}
	interval := w.Interval
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.Check(ctx)
	}
}

// Check asks now. With no endpoints the verdict is Unknown, the check off.
func (w *Watcher) Check(ctx context.Context) {
	if len(w.Endpoints) == 0 {
		w.mu.Lock()
		w.current = Verdict{State: Unknown, Why: "the check is off (no runtime endpoints)"}
		w.mu.Unlock()
		return
	}
	logger := klog.FromContext(ctx)
	v := Verdict{State: Unknown, Why: "no runtime socket at " + strings.Join(w.Endpoints, ", ")}
	for _, ep := range w.Endpoints {
		if path, ok := strings.CutPrefix(ep, "unix://"); ok {
			if _, err := os.Stat(path); err != nil {
				continue
			}
		}
		got, err := Ask(ctx, ep)
		if err != nil {
			v.Why = err.Error()
			break
		}
		v = got
		break
	}
	w.mu.Lock()
	changed := v != w.current
	w.current = v
	w.mu.Unlock()
	if !changed {
		return
	}
	logger.Info("Container runtime's CDI support", "state", v.State, "runtime", v.Runtime, "why", v.Why)
	if w.OnChange != nil {
		w.OnChange(v)
	}
}
