package runtimecdi

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name, runtime, version, config string
		want                           State
		why                            string
	}{
		{"containerd 1.7, CDI off (its default)", "containerd", "v1.7.22", `{"enableCDI":false,"cdiSpecDirs":["/etc/cdi","/var/run/cdi"]}`, Ignores, "enable_cdi = false"},
		{"containerd 1.7, CDI on", "containerd", "v1.7.22", `{"enableCDI":true}`, Applies, "enable_cdi = true"},
		{"containerd 2.x turned off", "containerd", "v2.1.4", `{"enableCDI":false}`, Ignores, "enable_cdi = false"},
		{"containerd 2.x without the key", "containerd", "v2.1.4", `{}`, Applies, "since containerd 2.0"},
		{"containerd 1.6", "containerd", "1.6.33", "", Ignores, "before 1.7"},
		{"containerd 1.7 without info", "containerd", "v1.7.2", "", Unknown, "no enable_cdi"},
		{"containerd, config not JSON", "containerd", "v1.7.2", `enable_cdi = true`, Unknown, "no enable_cdi"},
		{"containerd, version unreadable", "containerd", "devel", "", Unknown, "unreadable"},
		{"CRI-O", "cri-o", "1.35.0", "", Applies, "CRI-O"},
		{"another runtime", "fakeRuntime", "0.1.0", "", Unknown, "does not know"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := map[string]string{}
			if tc.config != "" {
				info["config"] = tc.config
			}
			v := Judge(tc.runtime, tc.version, info)
			if v.State != tc.want || !strings.Contains(v.Why, tc.why) {
				t.Errorf("Judge = %+v, want %s because %q", v, tc.want, tc.why)
			}
			if !strings.HasPrefix(v.String(), tc.runtime+" "+tc.version) {
				t.Errorf("String() = %q, want it to name the runtime", v.String())
			}
		})
	}
}

// FuzzJudge: any answer a runtime gives yields a verdict, and Ignores only from containerd's
// own word (enable_cdi = false) or a version before 1.7.
func FuzzJudge(f *testing.F) {
	f.Add("containerd", "v1.7.22", `{"enableCDI":false}`)
	f.Add("containerd", "1.6.0", "")
	f.Add("cri-o", "1.35.0", `{"enableCDI":false}`)
	f.Add("containerd", "v2.0.0-rc.1", `{"enableCDI":null}`)
	f.Fuzz(func(t *testing.T, name, ver, config string) {
		v := Judge(name, ver, map[string]string{"config": config})
		switch v.State {
		case Applies, Unknown:
		case Ignores:
			if !strings.EqualFold(name, "containerd") || (v.Why != "enable_cdi = false" && v.Why != "containerd before 1.7 has no CDI") {
				t.Fatalf("Ignores from %q %q %q: %+v", name, ver, config, v)
			}
		default:
			t.Fatalf("state %q", v.State)
		}
		_ = v.String()
	})
}

// fakeRuntime answers Version and Status as a containerd would.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	version, config string
}

func (r *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: r.version}, nil
}

func (r *fakeRuntime) Status(_ context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp := &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}
	if req.GetVerbose() {
		resp.Info = map[string]string{"config": r.config}
	}
	return resp, nil
}

func serve(t *testing.T, socket string, r *fakeRuntime) {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
}

// TestWatcher asks the first endpoint whose socket exists over a real gRPC socket, and tells
// each change once.
func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "containerd.sock")
	serve(t, socket, &fakeRuntime{version: "v1.7.22", config: `{"enableCDI":false}`})
	var changes []Verdict
	w := &Watcher{Endpoints: []string{"unix://" + filepath.Join(dir, "crio.sock"), "unix://" + socket}, OnChange: func(v Verdict) { changes = append(changes, v) }}
	if got := w.Current(); got.State != Unknown {
		t.Errorf("before the first answer: %+v, want unknown", got)
	}
	ctx := context.Background()
	w.Check(ctx)
	w.Check(ctx)
	want := Verdict{State: Ignores, Runtime: "containerd v1.7.22", Why: "enable_cdi = false"}
	if got := w.Current(); got != want {
		t.Errorf("Current = %+v, want %+v", got, want)
	}
	if len(changes) != 1 || changes[0] != want {
		t.Errorf("changes %+v, want one: %+v", changes, want)
	}

	none := &Watcher{Endpoints: []string{"unix://" + filepath.Join(dir, "none.sock")}}
	none.Check(ctx)
	if got := none.Current(); got.State != Unknown || !strings.Contains(got.Why, "no runtime socket at unix://") {
		t.Errorf("no socket: %+v", got)
	}

	// A runtime that does not answer within the bound is unknown, not a hang.
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := Ask(ctx, "unix://"+filepath.Join(dir, "none.sock")); err == nil {
		t.Error("Ask of a missing socket: no error")
	}
}
