package metricsserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynamig_test_probe", Help: "TestServe's probe."}))
	addr, stopped, err := Serve(ctx, "127.0.0.1:0", "--metrics-bind-address", reg)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr.String() + "/metrics"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "dynamig_test_probe 0") {
		t.Errorf("GET %s: %s\n%s", url, resp.Status, body)
	}

	// A second listener on the same address fails at once, naming the flag.
	if _, _, err := Serve(ctx, addr.String(), "--metrics-bind-address", reg); err == nil || !strings.Contains(err.Error(), "--metrics-bind-address") {
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
	addr, stopped, err = Serve(context.Background(), "", "--metrics-bind-address", reg)
	if err != nil || addr != nil {
		t.Errorf("empty address: addr %v, err %v", addr, err)
	}
	<-stopped
}
