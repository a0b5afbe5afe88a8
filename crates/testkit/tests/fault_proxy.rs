//! The fault proxy's faults of a whole database (a stall that holds what is sent until healed, a cut of every
//! connection at once) and of one connection (a delivery after which it hears nothing more).

use gateway_testkit::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestResult = anyhow::Result<()>;

/// A server that echoes every byte back, on a free loopback port.
async fn echo_server() -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                while let Ok(read) = socket.read(&mut buffer).await {
                    if read == 0 || socket.write_all(&buffer[..read]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// A proxy in front of an echo server that cuts only when told.
async fn proxy() -> anyhow::Result<FaultProxy> {
    Ok(FaultProxy::start(echo_server().await?, u64::MAX, 1).await?)
}

/// Reads exactly `length` bytes.
async fn read(connection: &mut TcpStream, length: usize) -> anyhow::Result<Vec<u8>> {
    let mut back = vec![0u8; length];
    connection.read_exact(&mut back).await?;
    Ok(back)
}

async fn round_trip(connection: &mut TcpStream, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    connection.write_all(bytes).await?;
    read(connection, bytes.len()).await
}

#[tokio::test]
async fn a_cut_of_all_closes_every_open_connection_and_new_ones_go_through() -> TestResult {
    let proxy = proxy().await?;
    let mut first = TcpStream::connect(proxy.addr()).await?;
    let mut second = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(round_trip(&mut first, b"one").await?, b"one");
    assert_eq!(round_trip(&mut second, b"two").await?, b"two");

    proxy.cut_all();
    for connection in [&mut first, &mut second] {
        let mut buffer = [0u8; 8];
        // Closed by the proxy: the end of the stream, or a reset.
        let read = connection.read(&mut buffer).await;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    let mut third = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(round_trip(&mut third, b"three").await?, b"three");
    Ok(())
}

#[tokio::test]
async fn what_is_sent_during_a_stall_goes_through_once_healed() -> TestResult {
    let proxy = proxy().await?;
    let mut open = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(round_trip(&mut open, b"before").await?, b"before");

    proxy.stall();
    open.write_all(b"during").await?;
    let mut made_during = TcpStream::connect(proxy.addr()).await?;
    made_during.write_all(b"new").await?;
    proxy.heal();

    assert_eq!(read(&mut open, 6).await?, b"during");
    assert_eq!(read(&mut made_during, 3).await?, b"new");
    Ok(())
}

#[tokio::test]
async fn a_silenced_delivery_leaves_its_connection_open_and_deaf_and_the_others_alone() -> TestResult
{
    let proxy = proxy().await?;
    let mut deaf = TcpStream::connect(proxy.addr()).await?;
    let mut other = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(round_trip(&mut deaf, b"before").await?, b"before");

    proxy.silence_delivery(b"mark");
    deaf.write_all(b"mark").await?;
    // Polling the proxy: the echo crosses it on its own task.
    while proxy.silenced() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    deaf.write_all(b"after").await?;
    assert_eq!(round_trip(&mut other, b"other").await?, b"other");
    let mut buffer = [0u8; 16];
    let heard = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        deaf.read(&mut buffer),
    )
    .await;
    assert!(
        heard.is_err(),
        "nothing reaches it, and it is not closed: {heard:?}"
    );
    Ok(())
}
