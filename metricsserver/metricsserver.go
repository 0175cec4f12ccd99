// Package metricsserver serves a Prometheus registry at /metrics for dynamig's commands (the
// scheduler's DynamicMIG metrics and the device plugin's): the listener opens before Serve
// returns, so a taken port fails the command at once, naming its flag.
package metricsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// ShutdownTimeout bounds how long the listener waits for open scrapes once its context ends.
const ShutdownTimeout = 5 * time.Second

// Serve serves g at /metrics on addr until ctx ends, then shuts the server down gracefully and
// closes the returned channel; it returns the listener's address. flag names the command's flag
// that set addr, in the error of a listener that cannot open. An empty addr serves nothing: a nil
// address and a closed channel. With ready checks, /readyz serves them too (200 when every
// check passes, 500 naming the failed ones; ?verbose lists each).
func Serve(ctx context.Context, addr, flag string, g prometheus.Gatherer, ready map[string]healthz.Checker) (net.Addr, <-chan struct{}, error) {
	stopped := make(chan struct{})
	if addr == "" {
		close(stopped)
		return nil, stopped, nil
	}
	logger := klog.FromContext(ctx)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", flag, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	if ready != nil {
		h := http.StripPrefix("/readyz", &healthz.Handler{Checks: ready})
		mux.Handle("/readyz", h)
		mux.Handle("/readyz/", h)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("Serving metrics", "address", ln.Addr().String(), "path", "/metrics")
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Metrics server failed", "address", ln.Addr().String())
		}
	}()
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			logger.Error(err, "Shutting down the metrics server")
		}
	}()
	return ln.Addr(), stopped, nil
}
