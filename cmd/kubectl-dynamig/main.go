// Command kubectl-dynamig is the kubectl plugin `kubectl dynamig`: with it on PATH,
// `kubectl dynamig nodes|pods|models` shows what dynamig did. See cmd/kubectl-dynamig/app.
package main

import (
	"context"
	"os"

	"github.com/dynamig/dynamig/cmd/kubectl-dynamig/app"
)

func main() {
	os.Exit(app.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
