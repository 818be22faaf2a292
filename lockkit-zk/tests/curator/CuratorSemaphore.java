// Curator's own InterProcessSemaphoreV2, driven from lockkit-zk's interop test.
//
//   java CuratorSemaphore <connect string> <path> <permits> try
//       prints "acquired" (and returns the lease at once) or "busy"
//   java CuratorSemaphore <connect string> <path> <permits> hold <millis>
//       waits up to 10 s for a lease, prints "acquired", holds it for
//       <millis>, returns it and prints "returned"
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class CuratorSemaphore {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String path = args[1];
        int permits = Integer.parseInt(args[2]);
        String action = args[3];
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(connect, 10_000, 5_000, new RetryOneTime(100))) {
            client.start();
            if (!client.blockUntilConnected(5, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected to " + connect);
            }
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, permits);
            if (action.equals("try")) {
                Lease lease = semaphore.acquire(0, TimeUnit.MILLISECONDS);
                System.out.println(lease == null ? "busy" : "acquired");
                if (lease != null) {
                    semaphore.returnLease(lease);
                }
            } else {
                Lease lease = semaphore.acquire(10, TimeUnit.SECONDS);
                if (lease == null) {
                    System.out.println("busy");
                    return;
                }
                System.out.println("acquired");
                System.out.flush();
                Thread.sleep(Long.parseLong(args[4]));
                semaphore.returnLease(lease);
                System.out.println("returned");
            }
        }
    }
}
