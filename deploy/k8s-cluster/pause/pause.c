/*
 * pause: the process that holds a pod's namespaces open (the kubelet's
 * "sandbox image"). There is no registry to pull registry.k8s.io/pause
 * from, so the test cluster builds its own: it sleeps, reaps the children
 * it inherits as PID 1, and exits on SIGINT or SIGTERM.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause (runbox test cluster)");
    return 0;
  }
  struct sigaction down = {.sa_handler = stop};
  sigaction(SIGINT, &down, NULL);
  sigaction(SIGTERM, &down, NULL);
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
}
