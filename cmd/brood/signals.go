package main

import (
	"context"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

func netSplit(s string) (string, string, error) { return net.SplitHostPort(s) }
