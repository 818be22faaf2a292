// Curator's own InterProcessSemaphoreV2, driven line by line by
// lockkit-testkit's CuratorPeer (interop tests and benchmarks).
//
//   java CuratorPeer <connect string> <path> <permits>
//
// Commands on stdin, one answer line each on stdout:
//   try      take a lease without waiting: "acquired" (held) or "busy"
//   return   return the held lease: "returned" ("none" if none is held)
//   cycle    acquire (waiting up to 10 s) and return a lease: the nanoseconds
//            the pair took, measured here, or "busy"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String path = args[1];
        int permits = Integer.parseInt(args[2]);
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(connect, 10_000, 5_000, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(5, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected to " + connect);
            }
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, permits);
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            System.out.println("ready");
            System.out.flush();
            Lease held = null;
            for (String line; (line = in.readLine()) != null; ) {
                switch (line.trim()) {
                    case "try": {
                        Lease lease = semaphore.acquire(0, TimeUnit.MILLISECONDS);
                        if (lease != null) {
                            held = lease;
                        }
                        System.out.println(lease == null ? "busy" : "acquired");
                        break;
                    }
                    case "return": {
                        if (held == null) {
                            System.out.println("none");
                        } else {
                            semaphore.returnLease(held);
                            held = null;
                            System.out.println("returned");
                        }
                        break;
                    }
                    case "cycle": {
                        long started = System.nanoTime();
                        Lease lease = semaphore.acquire(10, TimeUnit.SECONDS);
                        if (lease == null) {
                            System.out.println("busy");
                        } else {
                            semaphore.returnLease(lease);
                            System.out.println(System.nanoTime() - started);
                        }
                        break;
                    }
                    default:
                        System.out.println("unknown command: " + line);
                }
                System.out.flush();
            }
        }
    }
}
