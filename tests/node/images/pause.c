/* The pod sandbox's process: holds the pod's namespaces and does nothing else. Exits on SIGTERM or
 * SIGINT (as PID 1 it would otherwise ignore them and the kubelet would wait out the grace period),
 * and reaps children it inherits. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGTERM, quit);
  signal(SIGINT, quit);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
