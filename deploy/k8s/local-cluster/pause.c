/* The pod sandbox's process for deploy/k8s/local-k8s (there is no registry
 * to pull registry.k8s.io/pause from): it holds the pod's namespaces, reaps
 * the orphans that land on it, and exits on SIGINT or SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {0}, child = {0};
    stop.sa_handler = on_stop;
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}
