// Package netns runs a test process in a network namespace of its own, where a real pod
// network can be made without touching the host's: the test nodes' pods get veth pairs and
// routes there (CNI's ptp plugin), the API server is reached from pods at the kubernetes
// Service's address as in a cluster (Proxy stands in for kube-proxy for that one Service),
// and the API server reaches webhook pods at their pod IPs.
//
// The namespace lives and dies with the process: nothing is left on the host, and the
// sysctls CNI plugins set in it (ip_forward) are the namespace's own.
package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// marker is set in the environment of the process re-run in its namespace, to the network
// namespace it was started from.
const marker = "DYNAMIG_TEST_NETNS"

// unavailable says why the tests run without a namespace of their own (nil once in one).
var unavailable error = errors.New("netns.Main did not run")

// Main is a suite's TestMain step: as root, it runs prepare (when not nil), then the test
// binary again, with the same arguments and streams, in a new network namespace whose
// loopback is up, then prepare's cleanup, and exits with the tests' code; in that process (and
// where no namespace can be made) it returns and the caller runs the tests, which call
// Require. prepare is what needs the host's network (the go command's module downloads) and
// hands its results to the tests through the environment (os.Setenv), which they inherit.
func Main(m *testing.M, prepare func() (cleanup func(), err error)) {
	if os.Getenv(marker) != "" {
		if !Private() {
			fmt.Fprintf(os.Stderr, "netns: %s is set, but the process runs in the namespace it names\n", marker)
			os.Exit(1)
		}
		if err := loopbackUp(); err != nil {
			fmt.Fprintf(os.Stderr, "netns: %v\n", err)
			os.Exit(1)
		}
		unavailable = nil
		return
	}
	if os.Geteuid() != 0 {
		unavailable = errors.New("a pod network is made in a network namespace of the test's own, which needs root")
		return
	}
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		unavailable = err
		return
	}
	cleanup := func() {}
	if prepare != nil {
		if cleanup, err = prepare(); err != nil {
			fmt.Fprintf(os.Stderr, "netns: preparing the tests: %v\n", err)
			os.Exit(1)
		}
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), marker+"="+own)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	cleanup()
	var exit *exec.ExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		os.Exit(exit.ExitCode())
	default:
		fmt.Fprintf(os.Stderr, "netns: running the tests in a network namespace of their own: %v\n", err)
		os.Exit(1)
	}
}

// Require skips t unless the process runs in a namespace Main made.
func Require(t testing.TB) {
	t.Helper()
	if unavailable != nil {
		t.Skip(unavailable)
	}
}

// Private reports whether the process runs in a network namespace Main made: another than
// the one it was started from.
func Private() bool {
	own, err := os.Readlink("/proc/self/ns/net")
	from := os.Getenv(marker)
	return err == nil && from != "" && own != from
}

// loopbackUp brings lo up: a new namespace's is down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading lo's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// AddLocalAddress gives the namespace the IPv4 address ip (a /32 on a loopback alias), so
// that a listener can take it: a Service's cluster IP, which pods' packets reach through
// their routes to this namespace. Only in a namespace Main made.
func AddLocalAddress(ip net.IP) error {
	if !Private() {
		return errors.New("netns: an address is added only in the tests' own network namespace")
	}
	v4 := ip.To4()
	if v4 == nil {
		return fmt.Errorf("netns: %s is not an IPv4 address", ip)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// An alias per address, named after all of it (setting an alias's address replaces
	// the one it had); the label must fit IFNAMSIZ (15 characters).
	label := fmt.Sprintf("lo:%x", []byte(v4))
	for _, step := range []struct {
		req  uint
		addr net.IP
		what string
	}{
		{unix.SIOCSIFADDR, v4, "address"},
		// Without it the alias takes its class's netmask (10.0.0.0/8), and every 10.x pod
		// address would count as local.
		{unix.SIOCSIFNETMASK, net.IPv4(255, 255, 255, 255).To4(), "netmask"},
	} {
		ifr, err := unix.NewIfreq(label)
		if err != nil {
			return err
		}
		if err := ifr.SetInet4Addr(step.addr); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, step.req, ifr); err != nil {
			return fmt.Errorf("netns: setting %s's %s %s: %w", label, step.what, step.addr, err)
		}
	}
	return nil
}

// Proxy forwards TCP connections made to listen (host:port) to target until ctx ends: the
// one Service rule of kube-proxy a test cluster needs (the kubernetes Service, whose cluster
// IP pods' clients dial, to the API server's address).
func Proxy(ctx context.Context, listen, target string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("netns: proxy for %s: %w", target, err)
	}
	var wg sync.WaitGroup
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				wg.Wait()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer in.Close()
				var d net.Dialer
				out, err := d.DialContext(ctx, "tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					if c, ok := dst.(*net.TCPConn); ok {
						_ = c.CloseWrite()
					}
					done <- struct{}{}
				}
				go pipe(out, in)
				go pipe(in, out)
				select {
				case <-done:
					<-done
				case <-ctx.Done():
				}
			}()
		}
	}()
	return nil
}
