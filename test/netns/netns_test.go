package netns

import (
	"context"
	"io"
	"net"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	Main(m, nil)
	os.Exit(m.Run())
}

// TestNamespace: the tests run in a namespace of their own whose loopback works, an address
// added there is local and a proxy on it reaches its target; the host has neither.
func TestNamespace(t *testing.T) {
	Require(t)
	if !Private() {
		t.Fatal("not in a network namespace of its own")
	}
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("api server"))
			c.Close()
		}
	}()
	// Two addresses whose last bytes are the same: both stay.
	for _, ip := range []string{"10.0.0.1", "10.89.0.1"} {
		if err := AddLocalAddress(net.ParseIP(ip)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Proxy(ctx, "10.0.0.1:443", target.Addr().String()); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", "10.0.0.1:443")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "api server" {
		t.Errorf("through the proxy: %q", got)
	}
	for _, ip := range []string{"10.0.0.1", "10.89.0.1"} {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Errorf("%s is not local: %v", ip, err)
			continue
		}
		l.Close()
	}
	// Only the one address is local: a neighbour of it is not (the netmask is /32).
	if l, err := net.Listen("tcp", "10.0.0.2:0"); err == nil {
		l.Close()
		t.Error("10.0.0.2 is local too: the alias took a wider netmask")
	}
}
