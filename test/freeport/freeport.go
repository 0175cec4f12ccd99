// Package freeport chooses 127.0.0.1 ports for listeners that open later, in another
// process or after a few steps, without two choosers on the machine picking the same one.
//
// Choosing a port by opening and closing a listener leaves a window before the real
// listener opens. Two things have taken a port in that window: an outgoing connection
// given an ephemeral port (a device plugin's metrics port, while kubelets and the API
// server opened connections), and another test process of ours choosing the same port
// (make test's two lanes: a webhook failed with "address already in use" on CI). The first
// is avoided by choosing below the kernel's ephemeral range; the second by a reservation
// that every chooser respects: an abstract Unix socket named after the port, held by the
// choosing process until it exits. Abstract sockets live in the network namespace, as the
// ports do, and vanish with their process, so nothing is written to the host.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// base is the lowest port chosen: below it are well-known and registered services.
const base = 10000

var (
	mu sync.Mutex
	// held keeps the reservations alive (and out of the garbage collector's reach) for
	// the life of the process.
	held []*net.UnixListener
)

// Port returns a free 127.0.0.1 TCP port, reserved for this process among all callers of
// this package on the machine's network namespace.
func Port() (int, error) {
	low := ephemeralLow()
	for range 500 {
		port := 0 // the kernel's choice, when the ephemeral range leaves no room below it
		if low > base+1000 {
			port = base + rand.IntN(low-base)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		port = l.Addr().(*net.TCPAddr).Port
		if !reserve(port) {
			l.Close()
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free, unreserved 127.0.0.1 port found below %d", low)
}

// Ports returns n distinct ports, as Port.
func Ports(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := Port()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// reserve binds the abstract socket that marks port as taken; false when another chooser
// (this process included) holds it.
func reserve(port int) bool {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@dynamig-test-port-" + strconv.Itoa(port), Net: "unix"})
	if err != nil {
		return false
	}
	mu.Lock()
	held = append(held, l)
	mu.Unlock()
	return true
}

func ephemeralLow() int {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	if f := strings.Fields(string(raw)); len(f) == 2 {
		if v, err := strconv.Atoi(f[0]); err == nil {
			return v
		}
	}
	return 32768
}
