package app

import (
	"bytes"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"--bogus"}, exitUsage, "unknown flag: --bogus"},
		{"extra argument", []string{"now"}, exitUsage, "unknown command"},
		{"missing device config", []string{"--config=/nonexistent.yaml"}, exitUsage, "/nonexistent.yaml"},
		{"bad bind address", []string{"--bind-address=9443"}, exitUsage, "--bind-address"},
		{"bad port", []string{"--bind-address=:https"}, exitUsage, "the port must be a number"},
		{"empty scheduler name", []string{"--scheduler-name="}, exitUsage, "--scheduler-name"},
		{"outside a cluster", []string{"--bind-address=127.0.0.1:0"}, exitUsage, "in-cluster configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Main(tc.args, &out, &errOut)
			if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d (want %d), stderr %q (want %q)", code, tc.code, errOut.String(), tc.want)
			}
		})
	}
}
