package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynamig/dynamig/nvml/sim"
)

// The faults a test injects into a running sandbox, besides the restarts and the reboot of
// sandbox.go: NVML faults through the node's simulator (GPUs), the API server cut off from a
// node's device plugin (CutAPI), the device plugin killed at a chosen step (KillDevicePlugin
// with sim.HoldNext or sim.AfterNext), and a node clock skewed against the scheduler's.

// GPUs is node's simulated NVML, for fault injection (FailNext, HoldNext, AfterNext,
// LoseGPU, processes) and for reading what the hardware holds (Snapshot); nil for an
// unknown node.
func (s *Sandbox) GPUs(node string) *sim.Sim {
	if n := s.node(node); n != nil {
		return n.gpus
	}
	return nil
}

// CutAPI makes the API server unreachable from node's device plugin (its connections are
// reset and new ones refused) or, with cut false, reachable again. The kubelet and the
// scheduler keep their own connections.
func (s *Sandbox) CutAPI(node string, cut bool) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	n.apiLink.setCut(cut)
	return nil
}

// KillDevicePlugin stops node's device plugin as a kill would: nothing it was doing is
// finished or waited for (a call a test holds in NVML with sim.HoldNext stays where it is,
// as a killed process's last step does), and it waits only until the kubelet sees the
// plugin gone. StartDevicePlugin starts the next one.
func (s *Sandbox) KillDevicePlugin(ctx context.Context, node string) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	n.killDevicePlugin()
	if err := n.waitAllocatable(ctx, func(q int64) bool { return q == 0 }); err != nil {
		return fmt.Errorf("node %s: the kubelet did not see the device plugin go: %w", node, err)
	}
	return nil
}

// StartDevicePlugin starts node's device plugin after KillDevicePlugin and waits until the
// Node advertises its devices again.
func (s *Sandbox) StartDevicePlugin(ctx context.Context, node string) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	if err := n.startDevicePlugin(); err != nil {
		return err
	}
	if err := n.waitAllocatable(ctx, func(q int64) bool { return q > 0 }); err != nil {
		return fmt.Errorf("node %s: the Node does not advertise the started plugin's devices: %w", node, err)
	}
	return nil
}

// SetClockSkew sets how far node's clock (its device plugin's) is ahead of the scheduler's;
// negative is behind.
func (s *Sandbox) SetClockSkew(node string, skew time.Duration) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	n.clock.skew.Store(int64(skew))
	return nil
}

// skewedClock is a node's clock: the real one plus a skew.
type skewedClock struct{ skew atomic.Int64 }

func (c *skewedClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// apiLink relays a node's device plugin to the API server over loopback TCP (TLS passes
// through it untouched), so a test can cut the node off.
type apiLink struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

func newAPILink(target string) (*apiLink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &apiLink{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go l.serve()
	return l, nil
}

func (l *apiLink) addr() string { return l.ln.Addr().String() }

func (l *apiLink) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.relay(c)
	}
}

func (l *apiLink) relay(c net.Conn) {
	if !l.track(c) {
		return
	}
	up, err := net.DialTimeout("tcp", l.target, 10*time.Second)
	if err != nil {
		l.drop(c)
		return
	}
	if !l.track(up) {
		l.drop(c)
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	l.drop(c)
	l.drop(up)
}

// track records a connection, or closes it when the link is cut.
func (l *apiLink) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *apiLink) drop(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
}

func (l *apiLink) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for c := range l.conns {
			_ = c.Close()
			delete(l.conns, c)
		}
	}
}

func (l *apiLink) close() {
	_ = l.ln.Close()
	l.setCut(true)
}

// viaLink points a kubeconfig's clusters at the link.
func viaLink(kubeconfig string, l *apiLink) error {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + l.addr()
	}
	return clientcmd.WriteToFile(*cfg, kubeconfig)
}
