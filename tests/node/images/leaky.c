/* A process that leaks memory at a steady rate and does nothing else: a stand-in for a leaky
 * server whose working set the kubelet measures for real.
 *
 *   leaky [MIB_PER_STEP [STEP_SECONDS [START_MIB]]]
 *
 * or the environment LEAK_MIB_PER_STEP, LEAK_STEP_SECONDS, LEAK_START_MIB (arguments win).
 * Defaults: 4 MiB every second, nothing at start. Every page allocated is written, so it counts in
 * the cgroup's working set at once. Prints its total after each step; exits 0 on SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static long setting(int argc, char **argv, int i, const char *env, long fallback) {
  const char *s = i < argc ? argv[i] : getenv(env);
  if (s == NULL || *s == '\0') return fallback;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v < 0) {
    fprintf(stderr, "leaky: %s must be a whole number >= 0, got '%s'\n", env, s);
    exit(2);
  }
  return v;
}

static void leak(long mib) {
  for (long i = 0; i < mib; i++) {
    char *p = malloc(1 << 20);
    if (p == NULL) {
      fprintf(stderr, "leaky: out of memory\n");
      exit(1);
    }
    memset(p, 0xa5, 1 << 20);
  }
}

int main(int argc, char **argv) {
  signal(SIGTERM, quit);
  signal(SIGINT, quit);
  long step = setting(argc, argv, 1, "LEAK_MIB_PER_STEP", 4);
  long seconds = setting(argc, argv, 2, "LEAK_STEP_SECONDS", 1);
  long total = setting(argc, argv, 3, "LEAK_START_MIB", 0);
  if (seconds == 0) seconds = 1;
  leak(total);
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("leaky: %ld MiB, +%ld MiB every %ld s\n", total, step, seconds);
  for (;;) {
    struct timespec t = {seconds, 0};
    while (nanosleep(&t, &t) != 0) {
    }
    leak(step);
    total += step;
    printf("leaky: %ld MiB\n", total);
  }
}
