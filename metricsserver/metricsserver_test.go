package metricsserver

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynamig_test_probe", Help: "TestServe's probe."}))
	var ready atomic.Bool
	addr, stopped, err := Serve(ctx, "127.0.0.1:0", "--metrics-bind-address", reg, map[string]healthz.Checker{
		"registration": func(*http.Request) error {
			if !ready.Load() {
				return errors.New("not registered")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "dynamig_test_probe 0") {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	// /readyz follows its check.
	for _, tc := range []struct {
		ready    bool
		path     string
		wantCode int
		wantBody string
	}{
		{false, "/readyz", http.StatusInternalServerError, "registration"},
		{false, "/readyz?verbose=1", http.StatusInternalServerError, "[-]registration failed"},
		{false, "/readyz/registration", http.StatusInternalServerError, "not registered"},
		{true, "/readyz", http.StatusOK, "ok"},
		{true, "/readyz/registration", http.StatusOK, "ok"},
	} {
		ready.Store(tc.ready)
		if code, body := get(tc.path); code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("ready %t: GET %s: %d %q, want %d with %q", tc.ready, tc.path, code, body, tc.wantCode, tc.wantBody)
		}
	}

	// A second listener on the same address fails at once, naming the flag.
	if _, _, err := Serve(ctx, addr.String(), "--metrics-bind-address", reg, nil); err == nil || !strings.Contains(err.Error(), "--metrics-bind-address") {
		t.Errorf("second listener on %s: err = %v", addr, err)
	}

	cancel()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("metrics server did not stop after the context ended")
	}
	if _, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		t.Errorf("%s still accepts connections after shutdown", addr)
	}

	// Empty address: nothing served.
	addr, stopped, err = Serve(context.Background(), "", "--metrics-bind-address", reg, nil)
	if err != nil || addr != nil {
		t.Errorf("empty address: addr %v, err %v", addr, err)
	}
	<-stopped
}
