package freeport

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestNoPortTwice: one process never gets a port twice, and a port reserved by another
// process is refused here even though nothing listens on it.
func TestNoPortTwice(t *testing.T) {
	if os.Getenv("FREEPORT_CHILD") != "" {
		ports, err := Ports(300)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, p := range ports {
			s = append(s, strconv.Itoa(p))
		}
		os.Stdout.WriteString("PORTS " + strings.Join(s, ",") + "\n")
		os.Stdin.Read(make([]byte, 1)) // hold the reservations until the parent is done
		return
	}
	child := exec.Command(os.Args[0], "-test.run=^TestNoPortTwice$")
	child.Env = append(os.Environ(), "FREEPORT_CHILD=1")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); child.Wait() }()
	var theirs map[int]bool
	buf := make([]byte, 1<<16)
	var text string
	for !strings.Contains(text, "\n") || !strings.Contains(text, "PORTS ") {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatalf("child: %v (%q)", err, text)
		}
		text += string(buf[:n])
	}
	line := text[strings.Index(text, "PORTS ")+len("PORTS "):]
	line = line[:strings.Index(line, "\n")]
	theirs = map[int]bool{}
	for _, f := range strings.Split(line, ",") {
		p, _ := strconv.Atoi(f)
		theirs[p] = true
	}
	if len(theirs) != 300 {
		t.Fatalf("the child got %d distinct ports of 300", len(theirs))
	}
	for p := range theirs {
		if reserve(p) {
			t.Fatalf("port %d, reserved by the child, was reserved again here", p)
		}
	}
	mine, err := Ports(300)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range mine {
		if seen[p] || theirs[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}
